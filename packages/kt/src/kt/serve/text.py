"""Generated token ids -> the text deltas a stream sends, with OpenAI's stop strings."""

from __future__ import annotations


class TextStream:
    """Decodes the whole continuation at every token (a token may hold half a character, and
    tokenizers join pieces differently in context), sends only what is new, holds back a tail
    that could still become a stop string, and ends at the first stop string, which is not sent."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0            # characters of self.text already returned
        self.stopped = False     # a stop string was found

    def push(self, token_id: int) -> str:
        """Add one token; returns the text that can be sent now (maybe empty)."""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):      # an incomplete UTF-8 sequence: wait for the next token
            return ""
        self.text = text
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            return self._send(min(hits))
        hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return self._send(len(text) - hold)

    def flush(self) -> str:
        """The held-back tail, once generation ended without a stop string."""
        return self._send(len(self.text))

    def _send(self, end: int) -> str:
        delta = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return delta
