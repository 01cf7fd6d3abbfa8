"""A throwaway PostgreSQL server on loopback: a fresh cluster in a temporary folder, a free
port, trust authentication for one local user, stopped and deleted afterwards.

For the distributed sweep test and for trying ``--storage postgresql://...`` on one machine:

    with TempPostgres() as pg:
        print(pg.url)   # postgresql+psycopg2://audiofast@127.0.0.1:PORT/audiofast

Debian's ``postgresql`` package puts ``initdb`` / ``pg_ctl`` in /usr/lib/postgresql/*/bin.
PostgreSQL refuses to run as root, so under root the cluster belongs to the ``postgres``
system user (or ``nobody``), and the commands run through ``runuser``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here (apt-get install postgresql)."""


def find_bin(name: str) -> str:
    for candidate in sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True):
        return candidate
    found = shutil.which(name)
    if found:
        return found
    raise PostgresUnavailable(f"{name} not found (apt-get install postgresql)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TempPostgres:
    def __init__(self, user: str = "audiofast", database: str = "audiofast"):
        self.user, self.database = user, database
        self.initdb, self.pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
        self.port = 0
        self.root: Path | None = None
        self.owner: str | None = None  # the system user running the server (under root)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *cmd: str) -> subprocess.CompletedProcess:
        if self.owner:
            cmd = ("runuser", "-u", self.owner, "--", *cmd)
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> TempPostgres:
        self.root = Path(tempfile.mkdtemp(prefix="audiofast-pg-"))
        if os.geteuid() == 0:
            self.owner = next(u for u in ("postgres", "nobody") if _has_user(u))
            entry = pwd.getpwnam(self.owner)
            os.chmod(self.root, 0o755)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        data, sock = self.root / "data", self.root / "sock"
        self._run("mkdir", "-p", str(sock))
        self._run(self.initdb, "-D", str(data), "-U", self.user, "--auth=trust",
                  "--encoding=UTF8", "--no-sync")
        self.port = free_port()
        options = f"-p {self.port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(self.pg_ctl, "-D", str(data), "-o", options, "-l", str(self.root / "log"),
                  "-w", "-t", "60", "start")
        self._create_db()
        return self

    def _create_db(self) -> None:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user,
                                dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{self.database}"')
        conn.close()

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            if self.port:
                self._run(self.pg_ctl, "-D", str(self.root / "data"), "-m", "immediate", "-w",
                          "stop")
        except (subprocess.SubprocessError, OSError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> TempPostgres:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
