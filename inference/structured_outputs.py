"""Grammar-constrained decoding: a constrained sequence may only sample tokens its grammar allows.

The grammar library is xgrammar (what vLLM uses). Three things, and who owns them:
- A *compiled grammar* per distinct constraint (one JSON schema, one regex, ...). Compiling walks the whole
  49k-token vocabulary, about 0.1-1 s, so each constraint is compiled once and cached, on a background
  thread: `request_grammar` returns a Future at once, and the scheduler leaves the request waiting until
  the Future is done (`Request.grammar_ready`), so a compile never stalls the other requests' steps.
- A *matcher* per sequence (`Sequence.matcher`): the grammar's state after that sequence's output tokens.
  It is made at the sequence's first sample (each of n samples gets its own), advanced with every token
  the engine appends, and kept across preemption: recomputing re-runs the model over tokens the matcher
  has already accepted, so its state stays right. When it reaches the end of its grammar the sequence
  finishes (`is_terminated`).
- A *token mask* per step: for each constrained row, the tokens its matcher allows, applied by the
  sampler before anything else; how many tokens it removed is kept per generated token in the request's
  metrics (`RequestMetrics.masked_tokens`), which is what the playground shows.

A constraint is checked when its request is made, in the caller's thread, so a bad one fails that request
alone with a ValueError naming the problem: a JSON schema must pass the JSON Schema metaschema and use
no keyword that the mask does not enforce (`UNSUPPORTED_KEYWORDS`: the output would parse but might not
validate); xgrammar's own conversion then catches the rest (a bad regex or EBNF, an unresolvable $ref).
JSON is generated compactly (single spaces after ',' and ':', no newlines), so a small model cannot
wander off into whitespace.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch
from jsonschema import exceptions as schema_exceptions
from jsonschema import validators

from inference.sampling_params import StructuredOutputsParams
from inference.sequence import Request, Sequence

# Keywords the grammar cannot express (checked against xgrammar 0.2.8: it accepts most of these and then
# does not enforce them), with what to do instead.
UNSUPPORTED_KEYWORDS = {
    "oneOf": "the mask enforces 'at least one of' (anyOf), not 'exactly one of'; use anyOf",
    "allOf": "schemas cannot be intersected; merge them into one schema",
    "not": "negated schemas cannot be enforced",
    "if": "conditional schemas cannot be enforced",
    "then": "conditional schemas cannot be enforced",
    "else": "conditional schemas cannot be enforced",
    "uniqueItems": "item uniqueness cannot be enforced",
    "contains": "'contains' cannot be enforced; describe the items with 'items' or 'prefixItems'",
    "minContains": "'contains' cannot be enforced",
    "maxContains": "'contains' cannot be enforced",
    "patternProperties": "property-name patterns cannot be enforced; list the properties",
    "propertyNames": "property-name schemas cannot be enforced; list the properties",
    "dependentRequired": "dependencies between properties cannot be enforced",
    "dependentSchemas": "dependencies between properties cannot be enforced",
    "dependencies": "dependencies between properties cannot be enforced",
    "unevaluatedProperties": "use additionalProperties",
    "unevaluatedItems": "use items",
}
# String formats xgrammar turns into grammar rules; any other format would be ignored by the mask.
FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
})
# Where subschemas sit, so the keyword check reaches every one of them.
_ONE_SCHEMA = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("prefixItems", "items", "anyOf", "oneOf", "allOf")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
# xgrammar prefixes its messages with "[time] /path/file.cc:line: "; the client needs only the rest.
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def check_json_schema(schema: str | dict, where: str = "json") -> dict:
    """The schema as a dict, if it is a valid JSON schema the mask can enforce; else a ValueError."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: the schema is not valid JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a JSON schema must be an object, got {type(schema).__name__}")
    validator = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except schema_exceptions.SchemaError as exc:
        at = "".join(f"/{part}" for part in exc.path) or "/"
        raise ValueError(f"{where}: invalid JSON schema at {at}: {exc.message}") from None
    problems = list(_unsupported(schema, ""))
    if problems:
        raise ValueError(f"{where}: unsupported JSON schema keyword(s): {'; '.join(problems)}")
    return schema


def _unsupported(schema: Any, path: str) -> Iterator[str]:
    """'<json pointer>: why' for every keyword in the schema (and its subschemas) the mask cannot enforce."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        where = f"{path}/{key}"
        if key in UNSUPPORTED_KEYWORDS:
            yield f"{where}: {UNSUPPORTED_KEYWORDS[key]}"
        elif key == "format" and value not in FORMATS:
            yield f"{where}: format {value!r} is not enforced (supported: {', '.join(sorted(FORMATS))})"
        elif key == "multipleOf" and schema.get("type") != "integer":
            yield f"{where}: multipleOf is enforced only on integers"
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield from _unsupported(sub, f"{where}/{name}")
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _unsupported(sub, f"{where}/{i}")
        elif key in _ONE_SCHEMA:
            yield from _unsupported(value, where)


def _json_schemas_in(tag: Any) -> Iterator[Any]:
    """Every JSON schema inside an xgrammar structural tag (its "json_schema" formats)."""
    if isinstance(tag, dict):
        if tag.get("type") == "json_schema" and "json_schema" in tag:
            yield tag["json_schema"]
        for value in tag.values():
            yield from _json_schemas_in(value)
    elif isinstance(tag, list):
        for value in tag:
            yield from _json_schemas_in(value)


def _parse_json(text: str | dict, where: str) -> dict:
    if isinstance(text, dict):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None


def _build_grammar(params: StructuredOutputsParams):
    """The xgrammar Grammar of a constraint (fast: no vocabulary work); ValueError when it is invalid."""
    import xgrammar as xgr

    kind = params.kind
    where = f"structured_outputs.{kind}"
    try:
        if kind == "json":
            schema = check_json_schema(params.json, where)
            return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            # A JSON string literal is also a valid EBNF literal (same escapes).
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c) for c in params.choice))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(params.grammar)
        tag = _parse_json(params.structural_tag, where)
        for schema in _json_schemas_in(tag):
            check_json_schema(schema, where)
        return xgr.Grammar.from_structural_tag(json.dumps(tag))
    except RuntimeError as exc:  # xgrammar's errors (its own exception classes derive from RuntimeError)
        raise ValueError(f"{where}: {_XGRAMMAR_PREFIX.sub('', str(exc)).strip()}") from None


def _cache_key(params: StructuredOutputsParams) -> tuple[str, str]:
    """Equal constraints share one compiled grammar. Key order is kept: it is the order of the output."""
    value = getattr(params, params.kind)
    return params.kind, value if isinstance(value, str) else json.dumps(value)


@dataclass
class TokenMask:
    """The allowed tokens of this step's constrained rows: `allowed[r]` is the mask of row `rows[r]`."""

    rows: list[int]
    allowed: torch.Tensor  # [len(rows), vocab] bool


class StructuredOutputManager:
    """Compiles and caches grammars (any thread), and keeps each constrained sequence's matcher (the engine's).

    xgrammar is imported, and its view of the vocabulary built, only when the first constraint arrives, so
    an engine that never sees one pays nothing. The vocabulary is read from the engine's tokenizer on the
    compile thread (read-only: it lists the tokens' strings).
    """

    MAX_CACHED = 256

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._compiler = None
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self.num_compiles = 0
        self.num_cache_hits = 0

    # --- compiling (any thread) -----------------------------------------------------------------

    def request_grammar(self, params: StructuredOutputsParams) -> Future:
        """A Future of the constraint's compiled grammar, started now or shared with an equal constraint.

        Raises ValueError (in the caller's thread, nothing started) when the constraint is invalid.
        """
        key = _cache_key(params)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.num_cache_hits += 1
                return cached
        grammar = _build_grammar(params)
        with self._lock:
            future = self._cache.get(key)  # another thread may have started it meanwhile
            if future is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
                future = self._pool.submit(self._compile, grammar)
                self.num_compiles += 1
                self._cache[key] = future
                if len(self._cache) > self.MAX_CACHED:
                    self._cache.popitem(last=False)
            return future

    def _compile(self, grammar):
        """On the compile thread: the vocabulary-wide work that makes masks cheap per step."""
        import xgrammar as xgr

        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self.vocab_size)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        return self._compiler.compile_grammar(grammar)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # --- matching (the engine's thread) ---------------------------------------------------------

    @staticmethod
    def compile_error(request: Request) -> str | None:
        """Why the request's grammar failed to compile, once it has; None while compiling or when fine."""
        future = request.grammar
        if future is None or not future.done() or future.exception() is None:
            return None
        return f"structured_outputs: the grammar failed to compile ({future.exception()})"

    @staticmethod
    def wait_for_grammars(seqs: Iterable[Sequence], timeout: float = 0.05) -> None:
        """Block until one of these sequences' grammars is compiled, or `timeout` seconds pass."""
        pending = {seq.request.grammar for seq in seqs if not seq.request.grammar_ready}
        if pending:
            wait(pending, timeout, FIRST_COMPLETED)

    def token_mask(self, seqs: list[Sequence]) -> TokenMask | None:
        """Each constrained sequence's allowed next tokens (None when no row is constrained).

        Also records, per constrained sequence, how many vocabulary tokens the mask removes this step.
        """
        rows = [i for i, seq in enumerate(seqs) if seq.request.grammar is not None]
        if not rows:
            return None
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(rows), self.vocab_size)
        for r, i in enumerate(rows):
            self._matcher(seqs[i]).fill_next_token_bitmask(bitmask, r)
        allowed = _unpack(bitmask, self.vocab_size)
        removed = (self.vocab_size - allowed.sum(-1)).tolist()
        for i, count in zip(rows, removed):
            metrics = seqs[i].request.metrics
            metrics.masked_tokens.setdefault(seqs[i].index, []).append(count)
            metrics.mask_vocab_size = self.vocab_size
        return TokenMask(rows, allowed)

    def _matcher(self, seq: Sequence):
        """The sequence's matcher; a new one (its output so far replayed into it) on first use."""
        if seq.matcher is None:
            import xgrammar as xgr

            matcher = xgr.GrammarMatcher(seq.request.grammar.result())
            for token in seq.output_token_ids:
                if not matcher.accept_token(token):
                    raise RuntimeError(f"sequence {seq.seq_id}: its output does not follow its grammar")
            seq.matcher = matcher
        return seq.matcher

    @staticmethod
    def accept(seq: Sequence, token: int) -> None:
        """Advance the sequence's matcher by the token just sampled (which its mask allowed)."""
        if seq.matcher is not None and not seq.matcher.accept_token(token):
            raise RuntimeError(f"sequence {seq.seq_id}: the grammar refused token {token} its mask allowed")

    @staticmethod
    def is_terminated(seq: Sequence) -> bool:
        """The sequence's grammar is complete and has taken its stop token: nothing more may follow."""
        return seq.matcher is not None and seq.matcher.is_terminated()


_BITS = torch.arange(32, dtype=torch.int32)


def _unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's packed mask (int32 words, bit j of word w = token 32w + j) as [rows, vocab] bool."""
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1
    return bits.flatten(1)[:, :vocab_size].bool()
