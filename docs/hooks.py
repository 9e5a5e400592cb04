"""mkdocs hook: links from a docs page to a repository file outside ``docs/`` (a module, an example, a
benchmark) work on GitHub as they are; on the built site they point into the repository at
``repo_url`` when one is configured, or become the file's path as text. A link whose file does not
exist is a warning, so ``mkdocs build --strict`` fails on it as on any broken link."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

LOG = logging.getLogger("mkdocs.hooks.repository_links")
LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    repo = docs.parent
    source = (docs / page.file.src_uri).parent

    def rewrite(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        if "://" in target or target.startswith(("mailto:", "/")):
            return match.group(0)
        resolved = (source / target).resolve()
        if resolved.is_relative_to(docs):
            return match.group(0)  # mkdocs checks links inside the docs itself
        if not resolved.is_relative_to(repo) or not resolved.exists():
            LOG.warning("%s links to %s, which is not a file of the repository", page.file.src_uri, target)
            return match.group(0)
        path = resolved.relative_to(repo).as_posix()
        if config.get("repo_url"):
            return f"[{text}]({config['repo_url'].rstrip('/')}/blob/main/{path})"
        return text if path in text else f"{text} (`{path}`)"

    return LINK.sub(rewrite, markdown)
