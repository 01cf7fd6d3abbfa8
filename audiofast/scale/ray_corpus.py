"""A corpus transcribed on a Ray cluster: ``audiofast transcribe --ray DIR|MANIFEST --output
out.parquet``.

The pipeline is Ray Data's: ``read_binary_files`` (each file's bytes, read on the workers) ->
``map_batches`` over a pool of actors, each holding one loaded model (loading costs seconds, a
file costs less, so a model is loaded once per worker, not per file) -> rows back to the driver,
which writes them. One file per batch: files differ in length by minutes, and one-file batches
keep every worker busy until the corpus is done.

Resumable at file granularity: the driver appends each few rows as a parquet part under
``out.parquet.parts/`` (written to a temporary name, then renamed, so a killed run leaves whole
parts only). A new run skips every file a part or an earlier ``out.parquet`` holds, and at the end
the parts and the old output become one ``out.parquet`` (sorted by path, renamed into place). A
file that fails (corrupt, empty, no audio) gets a row with its one-line ``error`` and no text:
kept, not retried (delete the output to retry).

Multi-node: the paths must be readable by every node (a shared filesystem), as for any Ray Data
file source; ``address`` (or ``RAY_ADDRESS``) joins an existing cluster, else Ray starts one here.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from audiofast.asr.options import TranscribeOptions
from audiofast.asr.types import Transcription
from audiofast.audio import AudioError

AUDIO_SUFFIXES = frozenset({
    ".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".aac", ".wma", ".aif", ".aiff",
    ".webm", ".mp4", ".mkv", ".mov", ".amr",
})
FLUSH_ROWS = 16  # rows per parquet part: what a kill can cost is at most this many files
FLUSH_SECONDS = 30.0  # ... or this much time, whichever comes first


class CorpusError(ValueError):
    """The corpus cannot be listed or the output cannot be written; one line."""


def corpus_files(source: str | Path) -> list[Path]:
    """The audio files of ``source``: a directory (searched recursively, files with an audio
    suffix) or a manifest (a text file, one path per line, relative to the manifest's folder;
    blank lines and ``#`` comments skipped). Absolute, resolved and unique, in sorted order."""
    source = Path(source)
    if not source.exists():
        raise CorpusError(f"{source}: no such file or directory")
    if source.is_dir():
        files = [p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES]
        if not files:
            raise CorpusError(f"{source}: no audio files in it (looked for "
                              f"{', '.join(sorted(AUDIO_SUFFIXES))})")
        return sorted({p.resolve() for p in files})
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise CorpusError(f"{source}: not a manifest (want a text file of paths, one per "
                          "line) nor a directory") from None
    files = set()
    for number, line in enumerate(lines, start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        path = Path(entry) if Path(entry).is_absolute() else source.parent / entry
        if not path.is_file():
            raise CorpusError(f"{source}:{number}: {entry}: no such file")
        files.add(path.resolve())
    if not files:
        raise CorpusError(f"{source}: the manifest lists no files")
    return sorted(files)


def _schema():
    import pyarrow as pa

    word = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("word", pa.string()),
                      ("probability", pa.float64())])
    segment = pa.struct([
        ("id", pa.int32()), ("seek", pa.int32()), ("start", pa.float64()),
        ("end", pa.float64()), ("text", pa.string()), ("tokens", pa.list_(pa.int32())),
        ("avg_logprob", pa.float64()), ("compression_ratio", pa.float64()),
        ("no_speech_prob", pa.float64()), ("temperature", pa.float64()),
        ("words", pa.list_(word)),
    ])
    return pa.schema([
        ("path", pa.string()), ("text", pa.string()), ("language", pa.string()),
        ("language_probability", pa.float64()), ("duration", pa.float64()),
        ("segments", pa.list_(segment)), ("error", pa.string()),
    ])


def _row(path: str, result: Transcription | None, error: str | None = None) -> dict[str, Any]:
    if result is None:
        return {"path": path, "text": None, "language": None, "language_probability": None,
                "duration": None, "segments": None, "error": error}
    segments = [asdict(s) for s in result.segments]  # Segment's fields are the schema's
    return {"path": path, "text": result.text, "language": result.language,
            "language_probability": result.language_probability,
            "duration": result.duration, "segments": segments, "error": None}


class CorpusTranscriber:
    """One Ray actor: a model loaded once, then each batch of files' bytes -> rows."""

    def __init__(self, model_args: dict[str, Any], options: TranscribeOptions,
                 vad_filter: bool = False) -> None:
        from audiofast.asr.runtime import load_model

        self.model = load_model(**model_args)
        self.options = options
        self.vad_filter = vad_filter

    def __call__(self, batch):
        import pyarrow as pa

        rows = []
        for path, payload in zip(batch["path"].to_pylist(), batch["bytes"].to_pylist(),
                                 strict=True):
            try:
                result = self.model.transcribe(payload, self.options, progress=False,
                                               vad_filter=self.vad_filter)
                rows.append(_row(path, result))
            except (AudioError, ValueError) as err:  # this file only; the corpus goes on
                rows.append(_row(path, None, str(err).replace("<bytes>", path, 1)))
        return pa.Table.from_pylist(rows, schema=_schema())


@dataclass
class CorpusSummary:
    output: Path
    files: int  # in the corpus listing
    transcribed: int  # by this run (the rest were done by an earlier one)
    audio_seconds: float  # of the files this run transcribed
    wall_seconds: float  # of this run's pipeline, from Ray's start to the last row
    workers: int
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, error), whole corpus


class _Parts:
    """Rows written as parquet parts, each whole or absent (temporary name, then rename)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pending: list = []
        self.last_flush = time.monotonic()

    def add(self, table) -> None:
        self.pending.append(table)
        rows = sum(t.num_rows for t in self.pending)
        if rows >= FLUSH_ROWS or time.monotonic() - self.last_flush > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.last_flush = time.monotonic()
        if not self.pending:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        staging = self.folder / f".{name}.tmp"
        pq.write_table(pa.concat_tables(self.pending), staging)
        os.replace(staging, self.folder / name)
        self.pending = []


def _parts_folder(output: Path) -> Path:
    return output.with_name(output.name + ".parts")


def _written(output: Path):
    """Every row an earlier run wrote: the old output and the whole parts (a ``.tmp`` part is
    a write that was cut off, ignored)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    sources = [output] if output.exists() else []
    folder = _parts_folder(output)
    if folder.is_dir():
        sources += sorted(folder.glob("part-*.parquet"))
    for path in sources:
        try:
            tables.append(pq.read_table(path, schema=_schema()))
        except Exception as err:  # pyarrow raises several types for a file that is not ours
            raise CorpusError(f"{path}: cannot read it as this command's parquet output "
                              f"({str(err).splitlines()[0]}); move it away or choose another "
                              "--output") from None
    return pa.concat_tables(tables) if tables else _schema().empty_table()


def _finish(output: Path, table) -> None:
    """One sorted parquet file, each path once (the last row written wins), renamed into
    place; then the parts go."""
    import pyarrow.parquet as pq

    paths = table.column("path").to_pylist()
    last = {path: i for i, path in enumerate(paths)}
    table = table.take(sorted(last.values(), key=lambda i: paths[i]))
    staging = output.with_name(f".{output.name}.{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, staging)
    os.replace(staging, output)
    shutil.rmtree(_parts_folder(output), ignore_errors=True)


def _connect(address: str | None, log_to_driver: bool) -> None:
    import logging

    import ray
    import ray.data

    # Ray Data logs each dataset's plan and a warning that its bars are off (ours count
    # files): errors only. Set after the import, which installs Ray Data's logging config.
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    if ray.is_initialized():
        return
    ray.init(address=address or os.environ.get("RAY_ADDRESS"), include_dashboard=False,
             log_to_driver=log_to_driver, logging_level="ERROR")


def transcribe_corpus(source: str | Path, output: str | Path, *,
                      model_args: dict[str, Any] | None = None,
                      options: TranscribeOptions = TranscribeOptions(),
                      vad_filter: bool = False, workers: int | None = None,
                      threads_per_worker: int = 1, address: str | None = None,
                      progress: bool = True) -> CorpusSummary:
    """Transcribe every file of ``source`` (see :func:`corpus_files`) into the parquet file
    ``output`` on ``workers`` Ray actors (None: as many as the cluster's CPUs allow at
    ``threads_per_worker`` each). ``model_args``: :func:`audiofast.asr.runtime.load_model`'s
    keyword arguments (its ``threads`` is set from ``threads_per_worker``)."""
    output = Path(output)
    if output.is_dir():
        raise CorpusError(f"{output}: is a directory; --output names a .parquet file")
    if threads_per_worker < 1:
        raise CorpusError(f"threads per worker must be >= 1, not {threads_per_worker}")
    if workers is not None and workers < 1:
        raise CorpusError(f"workers must be >= 1, not {workers}")
    files = corpus_files(source)
    written = _written(output)
    done = set(written.column("path").to_pylist())
    todo = [str(path) for path in files if str(path) not in done]
    summary = CorpusSummary(output, len(files), 0, 0.0, 0.0, 0)
    if todo:
        import ray

        start = time.perf_counter()
        _connect(address, log_to_driver=False)
        if workers is None:
            workers = max(1, int(ray.cluster_resources().get("CPU", 1)) // threads_per_worker)
        summary.workers = workers = min(workers, len(todo))
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # ours counts files, theirs counts blocks
        # Reading bytes takes no CPU slot: with every CPU held by a model actor, a read task
        # that asked for one would wait forever (Ray Data's budget deadlocks on small
        # clusters). Two at a time: a zero-CPU task is otherwise unbounded, and each in flight
        # is a Python process of its own competing with the models for the cores.
        files_read = ray.data.read_binary_files(todo, include_paths=True, num_cpus=0,
                                                concurrency=2)
        dataset = files_read.map_batches(
            CorpusTranscriber, batch_size=1, batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=threads_per_worker,
            fn_constructor_kwargs={
                "model_args": {**(model_args or {}), "threads": threads_per_worker},
                "options": options, "vad_filter": vad_filter})
        parts = _Parts(_parts_folder(output))
        from tqdm import tqdm

        with tqdm(total=len(todo), unit="file", disable=not progress, desc="transcribe") as bar:
            for table in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
                parts.add(table)
                summary.transcribed += table.num_rows
                summary.audio_seconds += sum(d or 0.0 for d in
                                             table.column("duration").to_pylist())
                bar.update(table.num_rows)
        parts.flush()
        summary.wall_seconds = time.perf_counter() - start
        written = _written(output)
    _finish(output, written)
    listed = {str(path) for path in files}
    rows = written.select(["path", "error"]).to_pylist()
    summary.failed = sorted((row["path"], row["error"]) for row in rows
                            if row["error"] is not None and row["path"] in listed)
    return summary
