"""A run of restarts is not a failure (issue 15, cause 1): a real `steward` whose turn's
model call is SIGKILLed mid-stream in more lives in a row than `max_attempts` (5), but
fewer than the poison limit, answers the person once, with the model's text, as soon as a
life gets through: no "could not get an answer" apology, no quarantine."""

import json
import signal

from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.test_crash_agent import make_home, steward
from tests.test_crash_poison import finals, log_of

SESSION = "cli:restarts"
ANSWER = "The roof is fine, the gutters are clear, and nothing needs doing this week."
LIVES_KILLED = 6  # more than max_attempts, fewer than crash_limit


def script(request: dict, _wire: str) -> Reply:
    # Slow enough to commit a partial (llm_call.PARTIAL_EVERY) before it ends: the kill
    # point `mid-stream` is reached in each life.
    return Reply(text=ANSWER, chunk_chars=3, delay=0.03)


async def test_a_model_call_killed_in_six_lives_in_a_row_is_answered_once(store_url,
                                                                         tmp_path):
    with FakeLLMServer(script) as llm:
        home = make_home(tmp_path, store_url, llm.url, "openai")
        config = home / "config.toml"
        config.write_text(config.read_text() + "max_attempts = 5\ncrash_limit = 10\n"
                          "crash_window_seconds = 900\n")
        point = "mid-stream:llm_call"
        codes = [(await steward(home, "ask", "--session", SESSION, "how is the roof?",
                                kill_at=point))[0]]
        for _ in range(LIVES_KILLED - 1):
            codes.append((await steward(home, "resume", kill_at=point))[0])
        code, out, err = await steward(home, "resume")  # the 7th life gets through
        codes.append(code)

        entries = await log_of(home, SESSION)
        assert finals(entries) == [ANSWER], entries
        texts = [e["text"] for e in entries]
        assert not any("Sorry" in text for text in texts), texts
        assert codes == [-signal.SIGKILL] * LIVES_KILLED + [0], (codes, err[-3000:])
        assert out.count(ANSWER) == 1, out
        # Each life asked the model once; each cut-off stream is recorded as such.
        assert llm.count("/v1/chat/completions") == LIVES_KILLED + 1
        assert [e["kind"] for e in entries].count("aborted") == LIVES_KILLED
        code, out, _ = await steward(home, "tasks", "--json", "--limit", "100")
        tasks = [json.loads(line) for line in out.splitlines()]
        assert {t["state"] for t in tasks} == {"done"}, tasks
