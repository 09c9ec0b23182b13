"""`steward web` asks for a token on loopback too (issue 32): another user of the machine
can reach 127.0.0.1 as well. It prints the link with a fresh token each start, as Jupyter
does; the link's first visit turns the token into a cookie, so the pages' own links work
without it. A given token too weak to guard transcripts is refused before anything
listens. Each test runs the real `steward web` in its own process."""

import asyncio
import re
import sys

import httpx
import pytest

from tests.test_cli import steward, steward_env

LINK = re.compile(r"http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9._~-]+)")
STRONG = "a-given-token-of-24-char"


@pytest.fixture
def bare(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text('[llm]\nprovider = "scripted"\n')
    return home


@pytest.fixture
async def home(bare):
    """A home with one conversation in it (what the other user must not read)."""
    home = bare
    code, out, err = await steward(home, "ask", "secret plans for tuesday")
    assert code == 0, err
    return home


class Web:
    """`steward web` in its own process; `.port`, `.token` from the link it printed."""

    def __init__(self, home, *args, **env):
        self.home, self.args, self.env = home, args, env

    async def __aenter__(self):
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "web", "--port", "0", *self.args,
            env=steward_env(self.home, **self.env), cwd=self.home,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        line = (await asyncio.wait_for(self.proc.stdout.readline(), 30)).decode()
        m = LINK.search(line)
        if not m:
            self.proc.terminate()
            _, err = await asyncio.wait_for(self.proc.communicate(), 30)
            pytest.fail(f"no link with a token in {line!r}: {err.decode()[-2000:]}")
        self.port, self.token = int(m[1]), m[2]
        self.base = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc):
        self.proc.terminate()  # SIGTERM, to our own child
        await asyncio.wait_for(self.proc.wait(), 30)
        assert self.proc.returncode == 0, (await self.proc.stderr.read()).decode()[-2000:]


async def test_loopback_needs_the_printed_token(home):
    async with Web(home) as web, httpx.AsyncClient(base_url=web.base) as http:
        assert len(web.token) >= 32  # made up: 24 random bytes
        # What another local user's `curl 127.0.0.1:PORT` gets: nothing of the transcripts.
        for path in ("/", "/transcript?key=cli:default", "/context?key=cli:default",
                     "/tasks", "/style.css"):
            r = await http.get(path)
            assert r.status_code == 401, (path, r.status_code)
            assert "secret plans" not in r.text and "cli:default" not in r.text
        for wrong in (web.token[:-1], web.token + "x", web.token.swapcase(), "", "x" * 32):
            assert (await http.get("/", params={"token": wrong})).status_code == 401
            r = await http.get("/", headers={"Authorization": f"Bearer {wrong}".strip()})
            assert r.status_code == 401
        assert not http.cookies

        # The printed link: a cookie, and a redirect that drops the token from the address.
        r = await http.get(f"/?token={web.token}")
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        # Later pages and the pages' own links, without the token, by the cookie.
        r = await http.get("/")
        assert r.status_code == 200 and "cli:default" in r.text
        link = re.search(r'href="(/transcript\?key=cli(?::|%3A)default)"', r.text)
        assert link, r.text
        r = await http.get(link[1])
        assert r.status_code == 200 and "secret plans for tuesday" in r.text
        # A deep link with the token lands on that page, token gone from the address.
        r = await http.get("/tasks", params={"state": "done", "token": web.token})
        assert r.status_code == 303 and r.headers["location"] == "/tasks?state=done"
        # DNS rebinding: a page that calls itself another name is refused, cookie or not.
        r = await http.get("/", headers={"Host": f"evil.example:{web.port}"})
        assert r.status_code == 421 and "secret plans" not in r.text


async def test_each_start_has_its_own_token_and_cookie(home):
    """Two inspectors at once (two homes, or two starts): neither's token opens the
    other, and their cookies (one host, two ports) do not overwrite each other."""
    async with Web(home) as one, Web(home) as two, httpx.AsyncClient() as http:
        assert one.token != two.token and one.port != two.port
        assert (await http.get(f"{two.base}/?token={one.token}")).status_code == 401
        for web in (one, two):
            r = await http.get(f"{web.base}/?token={web.token}")
            assert r.status_code == 303
        names = {c.name for c in http.cookies.jar}
        assert len(names) == 2, names
        for web in (one, two):
            assert (await http.get(f"{web.base}/")).status_code == 200
        bearer = {"Authorization": f"Bearer {one.token}"}
        async with httpx.AsyncClient() as script:  # no cookies: scripts use the header
            assert (await script.get(f"{one.base}/tasks", headers=bearer)).status_code == 200
            assert (await script.get(f"{two.base}/tasks", headers=bearer)).status_code == 401


async def test_a_given_token_is_the_one_in_the_link(home):
    async with Web(home, "--token", STRONG) as web:
        assert web.token == STRONG
        async with httpx.AsyncClient(base_url=web.base) as http:
            r = await http.get("/", headers={"Authorization": f"Bearer {STRONG}"})
            assert r.status_code == 200
    async with Web(home, STEWARD_WEB_TOKEN=STRONG[::-1]) as web:
        assert web.token == STRONG[::-1]


@pytest.mark.parametrize(("given", "said"), [
    (["--token", "a"], "at least 16"),
    (["--token", "fifteen-chars-x"], "at least 16"),
    (["--token", "sixteen chars ok"], "letters, digits"),  # a space breaks the link
    (["--token", "sixteen&chars=ok"], "letters, digits"),
    ([], "at least 16"),  # $STEWARD_WEB_TOKEN=short, below
])
async def test_a_weak_token_is_refused_before_anything_listens(bare, given, said):
    env = steward_env(bare, **({} if given else {"STEWARD_WEB_TOKEN": "short"}))
    code, out, err = await steward(bare, "web", "--port", "0", *given, env=env)
    assert code == 2, (out, err)
    assert out == "" and "inspector is at" not in err
    assert err.startswith("steward: ") and said in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
