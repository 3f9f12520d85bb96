"""`kt sft`'s training data: JSONL records, one per line, tokenized into (input_ids, labels).

Three record kinds (the loss is taken on what the model should learn to write):
  {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}, ...]}
      rendered with the tokenizer's chat template; loss on the assistant messages' tokens;
  {"instruction": "...", "input": "...", "output": "..."}   (Alpaca; "input" optional)
      the instruction (and input) as a user turn, the output as the assistant's; loss on the output;
  {"text": "..."}   loss on every token.
Sequences are cut at max_length tokens. A bad line is an error naming the file, the line and what
was expected; blank lines are skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kt_core.errors import KTError

IGNORE = -100   # labels the loss skips (torch's CrossEntropyLoss ignore_index, transformers' convention)
ROLES = ("system", "user", "assistant")


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]


def _messages_of(record: dict, where: str) -> list[dict]:
    if "messages" in record:
        msgs = record["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise KTError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise KTError(f"{where}: messages[{i}] must be {{\"role\": one of {', '.join(ROLES)}, "
                              f"\"content\": a string}}, got {json.dumps(m)[:120]}")
        if not any(m["role"] == "assistant" for m in msgs):
            raise KTError(f"{where}: no assistant message, so nothing to learn from this record")
        return msgs
    instruction, output = record.get("instruction"), record.get("output")
    if not isinstance(instruction, str) or not isinstance(output, str):
        raise KTError(f"{where}: an instruction record needs string 'instruction' and 'output'")
    extra = record.get("input", "")
    if not isinstance(extra, str):
        raise KTError(f"{where}: 'input' must be a string, got {json.dumps(extra)[:80]}")
    prompt = instruction + ("\n\n" + extra if extra else "")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]


def _ids(tokenizer, messages: list[dict], generation_prompt: bool = False) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
    if isinstance(out, dict) or hasattr(out, "input_ids"):   # transformers 5 may return a BatchEncoding
        out = out["input_ids"]
    return list(out)


def _chat_example(tokenizer, messages: list[dict], where: str) -> Example:
    """Loss on each assistant message's tokens: the template rendered up to each message, the new
    tokens of an assistant message labelled, the rest ignored."""
    ids: list[int] = []
    labels: list[int] = []
    for i, m in enumerate(messages):
        upto = _ids(tokenizer, messages[: i + 1])
        if upto[: len(ids)] != ids:
            raise KTError(f"{where}: the tokenizer's chat template does not render messages[:{i + 1}] as an extension "
                          "of messages[:{i}], so the assistant's tokens cannot be found; use 'text' records")
        new = upto[len(ids):]
        if m["role"] != "assistant":
            labels += [IGNORE] * len(new)
        else:
            # The template's assistant header (what add_generation_prompt renders) is not the model's to write.
            header = len(_ids(tokenizer, messages[:i], generation_prompt=True)) - len(ids) if i else 0
            header = header if 0 <= header <= len(new) else 0
            labels += [IGNORE] * header + new[header:]
        ids = upto
    return Example(ids, labels)


def load_examples(path: Path, tokenizer, max_length: int) -> list[Example]:
    examples = []
    has_template = bool(getattr(tokenizer, "chat_template", None))
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {n}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise KTError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(record, dict):
                raise KTError(f"{where}: expected a JSON object, got {type(record).__name__}")
            if "text" in record:
                if not isinstance(record["text"], str) or not record["text"]:
                    raise KTError(f"{where}: 'text' must be a non-empty string")
                ids = tokenizer(record["text"]).input_ids
                bos = getattr(tokenizer, "bos_token_id", None)
                ids = ([bos] if bos is not None and (not ids or ids[0] != bos) else []) + list(ids)
                ex = Example(ids, list(ids))
            elif "messages" in record or "instruction" in record:
                if not has_template:
                    raise KTError(f"{where}: a chat/instruction record needs the tokenizer's chat template, and this "
                                  "tokenizer has none; use 'text' records")
                ex = _chat_example(tokenizer, _messages_of(record, where), where)
            else:
                raise KTError(f"{where}: expected a record with 'messages', 'instruction'/'output' or 'text'; "
                              f"got keys {', '.join(sorted(record)) or '(none)'}")
            ex = Example(ex.input_ids[:max_length], ex.labels[:max_length])
            if sum(1 for x in ex.labels[1:] if x != IGNORE) == 0:
                raise KTError(f"{where}: no token to learn within max_length={max_length} (the answer starts later, "
                              "or is empty)")
            examples.append(ex)
    if not examples:
        raise KTError(f"{path}: no records")
    return examples
