"""Corpus transcription on Ray Data: a real two-node local cluster, real recordings, output equal
to the plain CLI's, resumable, bad input named in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
import pyarrow.parquet as pq  # noqa: E402

from audiofast.scale.ray_corpus import CorpusError, corpus_files, transcribe_corpus  # noqa: E402

CLIPS = ("beckett", "two_cities", "clone-test")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "audiofast.cli", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def cluster():
    """A head and one worker node, one CPU each: two actors land on two nodes."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def corpus(tmp_path, clips) -> Path:
    folder = tmp_path / "corpus"
    (folder / "nested").mkdir(parents=True)
    shutil.copy(clips["beckett"].audio, folder / "beckett.wav")
    shutil.copy(clips["two_cities"].audio, folder / "nested" / "two_cities.wav")
    shutil.copy(clips["clone-test"].audio, folder / "clone-test.wav")
    (folder / "corrupt.wav").write_bytes(b"RIFF not really a wave file")
    (folder / "empty.wav").write_bytes(b"")
    (folder / "notes.txt").write_text("not audio, not listed\n")
    return folder


def _rows(output: Path) -> dict[str, dict]:
    return {Path(row["path"]).name: row for row in pq.read_table(output).to_pylist()}


def _transcribed_now(stderr: str) -> int:
    match = re.search(r"(\d+) transcribed now", stderr)
    assert match, stderr
    return int(match.group(1))


def test_two_node_cluster_output_equals_the_cli(cluster, corpus, tmp_path):
    output = tmp_path / "out.parquet"
    run = _cli("transcribe", "--ray", str(corpus), "--output", str(output), "--model",
               "whisper-tiny.en", "--threads", "1", "--workers", "2", "--no-progress",
               env={"RAY_ADDRESS": cluster.address})
    assert run.returncode == 1, run.stderr  # two files failed, and the exit status says so
    assert _transcribed_now(run.stderr) == 5
    assert "corrupt.wav: cannot decode audio" in run.stderr
    assert "empty.wav: empty input" in run.stderr
    rows = _rows(output)
    assert sorted(rows) == ["beckett.wav", "clone-test.wav", "corrupt.wav", "empty.wav",
                            "two_cities.wav"]
    assert rows["corrupt.wav"]["text"] is None and rows["empty.wav"]["segments"] is None

    good = [corpus / "beckett.wav", corpus / "nested" / "two_cities.wav",
            corpus / "clone-test.wav"]
    plain = _cli("transcribe", *map(str, good), "--model", "whisper-tiny.en", "--threads", "1",
                 "--format", "json", "--output-dir", str(tmp_path / "json"), "--no-progress")
    assert plain.returncode == 0, plain.stderr
    for path in good:
        expected = json.loads((tmp_path / "json" / f"{path.stem}.json").read_text())
        row = rows[path.name]
        assert row["error"] is None and row["path"] == str(path.resolve())
        assert row["text"] == expected["text"] and row["text"]
        assert row["language"] == expected["language"]
        assert row["duration"] == pytest.approx(expected["duration"])
        assert row["segments"] == expected["segments"]  # every field of every segment
    assert "It was the best of times" in rows["two_cities.wav"]["text"]


def test_a_second_run_transcribes_only_what_is_missing(cluster, corpus, tmp_path):
    output = tmp_path / "out.parquet"
    manifest = tmp_path / "first.txt"
    manifest.write_text(f"# the first batch\n{corpus / 'beckett.wav'}\n\ncorpus/clone-test.wav\n")
    env = {"RAY_ADDRESS": cluster.address}
    args = ("--output", str(output), "--model", "whisper-tiny.en", "--threads", "1",
            "--no-progress")
    first = _cli("transcribe", "--ray", str(manifest), *args, env=env)
    assert first.returncode == 0, first.stderr
    assert sorted(_rows(output)) == ["beckett.wav", "clone-test.wav"]
    # What a run killed after its first part leaves: whole parts and a part cut off mid-write.
    parts = output.with_name("out.parquet.parts")
    parts.mkdir()
    output.rename(parts / "part-00000000000000000001-abcdef01.parquet")
    (parts / ".part-00000000000000000002-abcdef02.parquet.tmp").write_bytes(b"PAR1 cut off")

    second = _cli("transcribe", "--ray", str(corpus), *args, env=env)
    assert second.returncode == 1  # corrupt.wav and empty.wav
    assert _transcribed_now(second.stderr) == 3  # two_cities, corrupt, empty: not the first two
    rows = _rows(output)
    assert len(rows) == 5 and rows["beckett.wav"]["text"].startswith("Ever tried")
    assert not parts.exists()  # merged into out.parquet

    third = _cli("transcribe", "--ray", str(corpus), *args, env=env)
    assert _transcribed_now(third.stderr) == 0  # nothing left; the failures stay reported
    assert third.returncode == 1 and "corrupt.wav" in third.stderr


def test_bad_corpus_and_output_get_one_line_errors(tmp_path, corpus):
    with pytest.raises(CorpusError, match="no such file or directory"):
        corpus_files(tmp_path / "missing")
    (tmp_path / "silent").mkdir()
    (tmp_path / "silent" / "readme.md").write_text("no audio here")
    with pytest.raises(CorpusError, match="no audio files in it"):
        corpus_files(tmp_path / "silent")
    manifest = tmp_path / "list.txt"
    manifest.write_text("corpus/beckett.wav\ncorpus/gone.wav\n")
    with pytest.raises(CorpusError, match=r"list.txt:2: corpus/gone.wav: no such file"):
        corpus_files(manifest)
    manifest.write_text("# only a comment\n\n")
    with pytest.raises(CorpusError, match="lists no files"):
        corpus_files(manifest)
    with pytest.raises(CorpusError, match="not a manifest"):
        corpus_files(corpus / "beckett.wav")
    with pytest.raises(CorpusError, match="is a directory"):
        transcribe_corpus(corpus, tmp_path)
    not_ours = tmp_path / "out.parquet"
    not_ours.write_text("a text file where the output should be")
    with pytest.raises(CorpusError, match="cannot read it as this command's parquet output"):
        transcribe_corpus(corpus, not_ours)
    assert not_ours.read_text().startswith("a text file")  # nothing lost


def test_cli_names_the_missing_piece():
    run = _cli("transcribe", "--ray", "somewhere")
    assert run.returncode != 0 and "--ray needs --output FILE.parquet" in run.stderr
    run = _cli("transcribe")
    assert run.returncode != 0 and "give audio FILEs or --ray" in run.stderr
    run = _cli("transcribe", "a.wav", "--ray", "corpus", "--output", "o.parquet")
    assert run.returncode != 0 and "not both" in run.stderr
    run = _cli("transcribe", "--ray", "missing-dir", "--output", "o.parquet")
    assert run.returncode != 0
    assert run.stderr.strip() == "audiofast: error: missing-dir: no such file or directory"
