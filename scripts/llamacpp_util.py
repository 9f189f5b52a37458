"""Shared by the scripts that drive llama.cpp through PyPI `llama-cpp-python`."""
import llama_cpp


def disable_repack() -> None:
    """Load models without llama.cpp's load-time weight repacking (`--no-repack`): the
    high-level `Llama` constructor has no switch for it, so wrap the default-params call."""
    default_params = llama_cpp.llama_model_default_params

    def no_repack_params():
        params = default_params()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama_model_default_params = no_repack_params
    llama_cpp.llama.llama_cpp.llama_model_default_params = no_repack_params
