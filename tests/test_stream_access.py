"""Who may use a live server: bearer tokens (flag, file, environment), the loopback rule and
the Origin check against cross-site WebSocket hijacking."""

from __future__ import annotations

import asyncio
import base64
import http.client
from types import SimpleNamespace
from urllib.parse import urlsplit

import numpy as np
import pytest
from websockets.exceptions import InvalidStatus

from audiofast.stream.access import resolve_token
from audiofast.stream.client import StreamClient
from audiofast.stream.server import ServerOptions, ServerThread, check_bind
from tests.test_stream import START, _exchange


def test_token_is_required_when_configured(live):
    with ServerThread(live, ServerOptions(port=0, token="s3cret")) as url:
        with pytest.raises(InvalidStatus) as err:
            asyncio.run(_exchange(url, START))
        assert err.value.response.status_code == 401

        async def with_token():
            async with StreamClient(url, token="s3cret") as client:
                await client.send(np.zeros(1600, dtype=np.float32))
                return await client.end()

        assert asyncio.run(with_token()).closed


def test_unauthenticated_server_stays_on_loopback():
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "token")
    with pytest.raises(ValueError, match="without --token"):
        check_bind("0.0.0.0", None)


def _upgrade_status(url: str, headers: dict[str, str]) -> int:
    """Status of a raw WebSocket handshake with exactly these Host/Origin headers (a browser's
    view, which a WebSocket client library would not let us fake)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.putrequest("GET", parts.path, skip_host=True)
    for name, value in {"Host": parts.netloc, "Upgrade": "websocket", "Connection": "Upgrade",
                        "Sec-WebSocket-Key": base64.b64encode(b"0123456789abcdef").decode(),
                        "Sec-WebSocket-Version": "13", **headers}.items():
        conn.putheader(name, value)
    conn.endheaders()
    status = conn.getresponse().status
    conn.close()
    return status


def test_other_sites_cannot_open_a_socket(live):
    """Cross-site WebSocket hijacking: any page the user visits may try ws://127.0.0.1."""
    with ServerThread(live, ServerOptions(port=0)) as url:
        netloc = urlsplit(url).netloc
        port = urlsplit(url).port
        assert _upgrade_status(url, {}) == 101  # no Origin: not a browser
        assert _upgrade_status(url, {"Origin": f"http://{netloc}"}) == 101  # our own page
        for origin in ("http://evil.example", "null", f"http://127.0.0.1:{port + 1}",
                       f"http://{netloc}.evil.example"):
            assert _upgrade_status(url, {"Origin": origin}) == 403, origin
        # DNS rebinding: evil.example resolved to 127.0.0.1, so Host matches Origin; no token.
        rebound = f"evil.example:{port}"
        assert _upgrade_status(url, {"Host": rebound, "Origin": f"http://{rebound}"}) == 403


def test_allow_origin_admits_listed_sites_only(live):
    with ServerThread(live, ServerOptions(port=0, allow_origins=("https://app.example",))) as url:
        assert _upgrade_status(url, {"Origin": "https://app.example"}) == 101
        assert _upgrade_status(url, {"Origin": "https://app.example.evil"}) == 403


def test_token_from_file_or_environment(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    assert resolve_token(None, str(secret), {}) == "s3cret"
    assert resolve_token(None, None, {"AUDIOFAST_TOKEN": "from-env"}) == "from-env"
    assert resolve_token("flag", None, {"AUDIOFAST_TOKEN": "from-env"}) == "flag"
    assert resolve_token(None, None, {}) is None
    (tmp_path / "empty").write_text("\n")
    for args, message in [(("flag", str(secret)), "not both"),
                          ((None, str(tmp_path / "empty")), "is empty"),
                          ((None, str(tmp_path / "missing")), "cannot read")]:
        with pytest.raises(ValueError, match=message) as err:
            resolve_token(*args, {})
        assert "\n" not in str(err.value)


def test_serve_command_takes_token_file_env_and_allowed_origins(tmp_path, monkeypatch):
    """The CLI wiring, without loading a model: the options reach the server."""
    from audiofast.cli import main

    made: list[ServerOptions] = []
    loaded: list[tuple] = []
    pads: list[tuple[float, float]] = []

    class FakeServer:
        def __init__(self, runtime, options, pad_s, draft, probe_pad_s):
            made.append(options)
            pads.append((pad_s, probe_pad_s))
            self.decoder = SimpleNamespace(spec="fake", engine="fake")

        async def serve_forever(self) -> None:
            return None

    monkeypatch.setattr("audiofast.stream.server.TranscriptionServer", FakeServer)
    monkeypatch.setattr("audiofast.asr.runtime.load_model",
                        lambda *a, **k: loaded.append((*a, k["encoder"], k["precision"])))
    secret = tmp_path / "token"
    secret.write_text("from-file")
    main(["serve", "--host", "0.0.0.0", "--token-file", str(secret),
          "--allow-origin", "https://a.example", "--allow-origin", "https://b.example"])
    assert made[-1].token == "from-file"
    assert made[-1].allow_origins == ("https://a.example", "https://b.example")
    # the packaged default, default engine, encoder, the model's own precision
    assert loaded[-1] == (None, "auto", "auto", None)
    assert pads[-1] == (10.0, 4.0)
    main(["serve", "--pad", "8", "--probe-pad", "2.5", "--encoder", "ct2",
          "--precision", "int8-head4-kv8"])
    assert pads[-1] == (8.0, 2.5) and loaded[-1][2:] == ("ct2", "int8-head4-kv8")
    with pytest.raises(SystemExit, match="--engine ct2 decodes on CTranslate2"):
        main(["serve", "--engine", "ct2", "--precision", "int8-head4-kv8"])
    monkeypatch.setenv("AUDIOFAST_TOKEN", "from-env")
    main(["serve", "--host", "0.0.0.0"])
    assert made[-1].token == "from-env"
    monkeypatch.delenv("AUDIOFAST_TOKEN")
    with pytest.raises(SystemExit, match="without --token"):
        main(["serve", "--host", "0.0.0.0"])
