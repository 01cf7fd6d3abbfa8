"""One OpenAI Realtime transcription session: our live events (and the VAD's utterances)
translated, in order, into OpenAI's item events (openai_realtime.py serves them)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import WebSocket

from audiofast.audio import SAMPLE_RATE
from audiofast.stream.protocol import ATTACHED, StartConfig
from audiofast.stream.realtime_config import INPUT_RATE, RealtimeConfig
from audiofast.stream.scheduler import LiveSession
from audiofast.stream.session import StreamSession


@dataclass
class Item:
    """One utterance (server VAD) or one committed buffer: a user message item."""

    id: str
    text: str = ""
    pending: str = ""  # text decoded before the item was committed, sent with the commit
    committed: bool = False
    done: bool = False
    seconds: float = 0.0  # its audio, for the completed event's usage


class RealtimeSession(LiveSession):
    """A live session whose events leave in OpenAI's Realtime shapes (``emit`` translates
    our ``final`` events and the VAD's utterances into them, in order, as they happen)."""

    def __init__(self, ws: WebSocket, config: RealtimeConfig, stream: StreamSession | None,
                 beta: bool, max_outbox: int, failures: Counter[str]):
        start = StartConfig(INPUT_RATE, "pcm_s16le", 1, config.language)
        super().__init__(ws, start, stream, max_outbox, failures)  # type: ignore[arg-type]
        self.realtime, self.beta = config, beta
        self.items: dict[int, Item] = {}  # by utterance index (server VAD) or commit count
        self.hidden: set[int] = set()  # utterances the client cleared
        self.buffer: list[np.ndarray] = []  # manual turns: audio since the last commit
        self.previous_id: str | None = None
        self._event_ids = itertools.count(1)
        self._item_ids = itertools.count(1)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "event_id": f"event_{self.id}_{next(self._event_ids)}", **fields}

    def error(self, code: str, message: str, param: str | None = None,
              client_event: str | None = None) -> dict[str, Any]:
        return self.event("error", error={"type": "invalid_request_error", "code": code,
                                          "message": message, "param": param,
                                          "event_id": client_event})

    def new_item(self, key: int) -> Item:
        item = self.items[key] = Item(f"item_{self.id}_{next(self._item_ids)}")
        return item

    def emit(self, events: list[dict[str, Any]]) -> None:
        out = self._turns()  # an utterance's onset goes out before its text
        for event in events:
            if event["type"] == "final" and event["utterance"] not in self.hidden:
                item = self.items.get(event["utterance"]) or self.new_item(event["utterance"])
                out += self._text(item, event["text"])
            elif event["type"] == "error" and "error" not in event:  # ours, from the policy
                out.append(self.error(event.get("code", "error"), event["message"]))
            elif event["type"].startswith(("input_audio_buffer.", "conversation.", "session.",
                                           "transcription_session.", "error")):
                out.append(event)  # already in OpenAI's shape
        super().emit(out + self._closes())

    def _text(self, item: Item, text: str) -> list[dict[str, Any]]:
        joined = item.text + item.pending
        piece = text if not joined or text[:1] in ATTACHED else " " + text
        if not item.committed:
            item.pending += piece
            return []
        item.text += piece
        return [self.event("conversation.item.input_audio_transcription.delta",
                           item_id=item.id, content_index=0, delta=piece)]

    def commit(self, item: Item) -> list[dict[str, Any]]:
        """``committed`` (+ the item's creation), then what was decoded before it."""
        item.committed = True
        added = "conversation.item.created" if self.beta else "conversation.item.added"
        out = [self.event("input_audio_buffer.committed", item_id=item.id,
                          previous_item_id=self.previous_id),
               self.event(added, previous_item_id=self.previous_id, item={
                   "id": item.id, "object": "realtime.item", "type": "message",
                   "role": "user", "status": "completed",
                   "content": [{"type": "input_audio", "transcript": None}]})]
        self.previous_id = item.id
        if item.pending:
            pending, item.pending = item.pending.strip(), ""
            out += self._text(item, pending)
        return out

    def complete(self, item: Item, seconds: float) -> dict[str, Any]:
        item.done = True
        return self.event("conversation.item.input_audio_transcription.completed",
                          item_id=item.id, content_index=0, transcript=item.text.strip(),
                          usage={"type": "duration", "seconds": round(seconds, 3)})

    def _turns(self) -> list[dict[str, Any]]:
        """Server VAD: the utterances' onsets and ends since the last call."""
        stream = self.stream
        if stream is None:
            return []
        out: list[dict[str, Any]] = []
        for utt in stream.utterances:
            item = self.items.get(utt.index)
            if item is None and utt.index not in self.hidden:
                item = self.new_item(utt.index)
                out.append(self.event("input_audio_buffer.speech_started",
                                      audio_start_ms=ms(utt.onset), item_id=item.id))
            if item is not None and utt.end is not None and not item.committed:
                item.seconds = (utt.end - utt.onset) / SAMPLE_RATE
                out.append(self.event("input_audio_buffer.speech_stopped",
                                      audio_end_ms=ms(utt.end), item_id=item.id))
                out += self.commit(item)
        return out

    def _closes(self) -> list[dict[str, Any]]:
        """Server VAD: ``completed`` for each utterance the stream has closed (all its text
        was emitted before it left ``stream.utterances``)."""
        if self.stream is None:
            return []
        out: list[dict[str, Any]] = []
        open_now = {u.index for u in self.stream.utterances}
        for index, item in self.items.items():
            if index > 0 and index not in open_now and not item.done \
                    and index not in self.hidden:
                if not item.committed:  # closed before its end was seen here
                    out += self.commit(item)
                out.append(self.complete(item, item.seconds))
        return out

    def failure_event(self, code: str, message: str) -> dict[str, Any]:
        return self.error(code, message)


def ms(sample: int) -> int:
    return round(sample * 1000 / SAMPLE_RATE)
