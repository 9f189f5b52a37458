//! How the server was started, in the words its messages use: an API client that meets a limit
//! fixed at start is told which `snug serve` option set it (`snug serve --ctx`). The names live
//! here once, so every message says the same and they change with the command line's. This
//! module uses nothing of the crate.

/// The context each sequence holds.
pub const CTX: &str = "snug serve --ctx";
/// The largest request body.
pub const MAX_BODY: &str = "--max-body";
/// Adapters kept ready at once (the adapter share is sized by it).
pub const MAX_LORAS: &str = "--max-loras";
/// The directory adapters are registered from.
pub const LORA_DIR: &str = "--lora-dir";
/// The address the server listens on.
pub const HOST: &str = "--host";
/// Web origins whose pages may call the server.
pub const ALLOWED_ORIGINS: &str = "--allowed-origins";
/// The key the administration routes take.
pub const ADMIN_KEY: &str = "--admin-key";
/// Administration without a key (loopback only).
pub const ALLOW_ADMIN: &str = "--allow-admin";
