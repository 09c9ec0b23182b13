"""`steward ask`, as a real process, against a fake llama-server with a Gemma-like strict
template and a weak model that garbles its tool calls (tests/fakes/local_llm_server.py):
configured as the issue's user did (`[llm] provider = "openai"` with a `base_url`), the
question gets an answer, nothing garbled runs, and the next `steward ask` in the same
conversation is answered normally."""

import json

from tests.fakes.local_llm_server import LocalLLMServer, Output
from tests.test_cli import steward
from tests.test_local_model_turns import garbled_calls


async def test_a_weak_model_behind_a_strict_template_leaves_the_conversation_working(
        tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    outputs = [Output(calls=garbled_calls(), finish="length"),
               Output("Sorry, I got muddled."), Output("Tea, I remember.")]
    with LocalLLMServer(outputs, strict_roles=True) as server:
        (home / "config.toml").write_text(
            f'[llm]\nprovider = "openai"\nbase_url = "{server.url}"\nmodel = "gemma3"\n')
        code, out, err = await steward(home, "ask", "remember that Anna likes tea")
        assert (code, out.strip()) == (0, "Sorry, I got muddled."), err
        code, out, err = await steward(home, "ask", "what does Anna like?")
        assert (code, out.strip()) == (0, "Tea, I remember."), err
    # each process learned the template once; nothing else was refused
    assert server.statuses.count(400) == 2 and set(server.statuses) == {200, 400}
    code, out, _ = await steward(home, "tasks", "--json")
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert "llm_call" in kinds and "tool_call" not in kinds  # none of the fifteen ran
