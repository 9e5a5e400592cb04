"""The client layer: any token-level engine as an ``openai.AsyncOpenAI`` with a token ledger.

Names are imported lazily so that ``bridges.client.tool_calls`` (pure Python) can be used without
loading the openai SDK and the tokenizer stack.

May import: ``bridges.runtime``, ``bridges.envs`` (records and messages), ``bridges.models``. Must not
import runs, backends or applications: an engine is handed to the client, never looked up by it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridges.runtime.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "EngineClient": "bridges.client.engine_client",
    "UnsupportedEndpointError": "bridges.client.engine_client",
    "ChatRenderer": "bridges.client.rendering",
    "ChatTemplateError": "bridges.client.rendering",
    "TokenLedger": "bridges.client.ledger",
    "LedgerRecord": "bridges.client.ledger",
    "ParsedToolCall": "bridges.client.tool_calls",
    "parse_hermes": "bridges.client.tool_calls",
    "parse_llama3_json": "bridges.client.tool_calls",
    "get_tool_parser": "bridges.client.tool_calls",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("bridges.client", _EXPORTS, globals())



if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from bridges.client.engine_client import EngineClient, UnsupportedEndpointError  # noqa: F401
    from bridges.client.ledger import LedgerRecord, TokenLedger  # noqa: F401
    from bridges.client.rendering import ChatRenderer, ChatTemplateError  # noqa: F401
    from bridges.client.tool_calls import (  # noqa: F401
        ParsedToolCall,
        get_tool_parser,
        parse_hermes,
        parse_llama3_json,
    )
