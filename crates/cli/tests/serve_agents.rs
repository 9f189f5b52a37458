//! The coding agents' APIs over loopback (issue 48), driven by the official Python clients
//! (`serve_agents.py`): Anthropic's Messages (create, stream, forced and streamed `tool_use`,
//! a `tool_result` round trip read from the prefix cache, `count_tokens` equal to input plus
//! cache read, system blocks with `cache_control`, errors in Anthropic's shape), OpenAI's
//! Responses (create, stream, a required call with built-in tool types ignored, a
//! `function_call_output` round trip, `text.format` json_schema, the stateless 400), and an
//! `openai-agents` agent whose tool is called and whose final answer is given; a 3-turn tool
//! session through Chat Completions, Messages and Responses whose later turns read the previous
//! answer from the prefix cache (prompt reuse by text). qwen2.5-coder-0.5b
//! with its own template (the agent runs on qwen2.5-coder-1.5b: given its tool's result, the
//! 0.5b calls the tool again until the agent's turns run out); an API key checked as
//! `x-api-key` and as `Bearer`.

mod common;

use common::serve::Server;

const ALIAS: &str = "qwen2.5-coder-0.5b";
const KEY: &str = "agent-key";

fn run_script(mode: &str, alias: &str) {
    let model = common::model(alias);
    let args =
        ["--name", ALIAS, "--parallel", "1", "--ctx", "2048", "--threads", "2", "--api-key", KEY];
    let server = Server::start(&model, &args);
    common::python(
        "serve_agents.py",
        &[server.url().as_str(), ALIAS, mode, KEY],
        "anthropic openai openai-agents",
    );
}

#[test]
fn anthropic_messages_through_the_anthropic_client() {
    run_script("messages", ALIAS);
}

#[test]
fn openai_responses_through_the_openai_client() {
    run_script("responses", ALIAS);
}

#[test]
fn every_later_agent_turn_reads_the_previous_answer_from_the_cache() {
    run_script("turns", ALIAS);
}

#[test]
fn an_openai_agents_agent_calls_its_tool_and_answers() {
    run_script("agents", "qwen2.5-coder-1.5b");
}
