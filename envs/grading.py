"""Answer extraction and equivalence grading for math benchmarks (BeyondAIME, IMO-AnswerBench).

Two steps, each a pure function:

1. :func:`extract_answer` pulls the final answer out of a model's reply: the last ``\\boxed{...}``
   (or ``\\boxed x`` / ``\\fbox{...}``, braces matched with nesting), else the last "Answer:" /
   "Final answer:" / "The answer is" statement, else (integer benchmarks only) the last number.
2. :func:`grade` decides whether that answer is equivalent to the reference and records how:

   * ``"none"``: there was no answer to grade.
   * ``"math-verify"``: the structured path. On integer benchmarks, when both sides normalise to
     plain integers, they are compared exactly as integers (which is what math-verify would do, but
     without its parser); everything else goes through HuggingFace ``math_verify``
     (``parse`` both sides as LaTeX, then ``verify(gold, pred)``; the order matters, since the
     function is asymmetric for assignments such as ``P(x)=2x^2+c`` vs ``2x^2+c``).
   * ``"fallback"``: the reference is something math-verify cannot represent faithfully (see
     :func:`fallback_needed`): a phrase ("odd $n$", "All powers of 2"), an answer with a side
     condition ("... for some $a>0$"), an ellipsis or set-builder notation, a piecewise answer on
     several lines. These are graded by a conservative normalised-text comparison: the same
     normalisation is applied to both sides and only notation is removed (``$``, ``\\text{}``,
     ``\\left``/``\\right``, spacing, a leading "all"/"the answer is", a trailing period), plus a
     few explicit synonym rules ("odd n" = "n is odd", "no solutions" = "none"). A wrong
     "equivalent" is worse than a miss, so nothing clever happens here.

Two deliberate departures from math-verify's defaults, both to avoid false positives:

* Unit stripping is switched off (by default ``2-2m`` parses as ``2-2`` because ``m`` reads as
  metres).
* math-verify lowercases every symbol, so ``R-2r`` would equal ``-r``. When one string uses a
  letter in both cases, its upper-case occurrences are renamed to a distinct subscripted symbol
  first (``R`` -> ``R_{U}``). A string that uses only one case keeps math-verify's case-insensitive
  behaviour (``\\frac{50}{39}A`` still matches ``\\frac{50}{39}a``).

Timeouts: math-verify bounds its parse and compare steps with ``signal.alarm``, which only works in
the main thread; in another thread it raises. :func:`grade` therefore passes timeouts only when it
runs in the main thread and disables them elsewhere (e.g. under ``asyncio.to_thread``). Without a
timeout a pathological input could stall sympy, so in that case inputs that are very long or
contain numeric power towers / huge factorials are refused (graded incorrect) instead of parsed.
For a hard guarantee off the main thread, run :func:`grade` in a ``ProcessPoolExecutor``: it is a
picklable top-level function and each worker calls it from its own main thread. Any exception
from the parser is caught: :func:`grade` never raises on odd input.
"""

from __future__ import annotations

import logging
import math
import re
import signal
import threading
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class _NoTimeoutNotice(logging.Filter):
    """math-verify warns on every call made without signal timeouts, which :func:`grade` does on
    purpose off the main thread (see above); the notice would flood the logs of a concurrent run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutNotice())

# Seconds for each math-verify parse / compare step (main thread only; see module docstring).
TIMEOUT_S = 5
# Longest answer string handed to the parser when no timeout can protect it.
MAX_UNGUARDED_CHARS = 1000


@dataclass(frozen=True)
class Grade:
    """The verdict on one answer.

    ``method`` is ``"math-verify"`` (structured comparison: exact integers or math_verify),
    ``"fallback"`` (normalised-text comparison for references math-verify cannot parse) or
    ``"none"`` (no answer was extracted, or it was blank).
    """

    correct: bool
    method: str
    pred: str | None
    gold: str


# -- extraction ---------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_ANSWER_RE = re.compile(
    r"(?:\bfinal\s+answer|\banswer)\s*(?:\*\*)?\s*[:：]|\b(?:final\s+)?answer\s+is\b\s*:?",
    re.IGNORECASE,
)
# An optional minus sign (not a subtraction such as `x-5`), then digits with optional thousands
# separators and decimals. Decimals are kept so that `3.5` never yields `5`.
_NUMBER_RE = re.compile(r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


def extract_answer(text: str, *, integer: bool = False) -> str | None:
    """Return the final answer in ``text``, or None when there is none.

    Order: the last ``\\boxed{...}`` / ``\\boxed x`` / ``\\fbox{...}``; else the last
    "Answer:"-style statement; else, only when ``integer`` is true, the last number (thousands
    separators removed: ``1,000`` -> ``1000``).
    """
    if not isinstance(text, str) or not text.strip():
        return None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    stated = _answer_statement(text)
    if stated is not None:
        return stated
    if integer:
        return _last_number(text)
    return None


def _last_boxed(text: str) -> str | None:
    """Content of the last well-formed, non-empty ``\\boxed``/``\\fbox``; None if there is none."""
    for match in reversed(list(_BOX_RE.finditer(text))):
        i = match.end()
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == "{":
            content = _braced(text, i)
        else:  # `\boxed 5`: one token, up to whitespace or the end of inline math
            token = re.match(r"[^\s$]+", text[i:])
            content = token.group(0) if token and match.end() < i else None
        if content is not None and content.strip():
            return content.strip()
    return None


def _braced(text: str, start: int) -> str | None:
    """The text inside the brace group opening at ``text[start]``; None if it never closes."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # skip escaped characters such as \{ and \}
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
        i += 1
    return None


def _answer_statement(text: str) -> str | None:
    matches = list(_ANSWER_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end() :]
    lines = rest.split("\n")
    first = lines[0].strip()
    if not _strip_answer_decoration(first):  # "Final answer:" alone; the answer is on the next line
        first = next((line.strip() for line in lines[1:] if line.strip()), "")
    answer = _strip_answer_decoration(first)
    return answer or None


def _strip_answer_decoration(s: str) -> str:
    """Remove markdown bold, surrounding ``$``/``\\(\\)``/``\\[\\]`` and a trailing period."""
    prev = None
    while prev != s:
        prev = s
        s = s.strip().rstrip(".").strip()
        for left, right in (("**", "**"), ("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
                s = s[len(left) : len(s) - len(right)]
        if s.startswith("**") and s.count("**") == 1:  # "**Answer:** 5" leaves "** 5"
            s = s[2:]
    return s.strip()


def _last_number(text: str) -> str | None:
    matches = list(_NUMBER_RE.finditer(text))
    if not matches:
        return None
    return matches[-1].group(0).replace(",", "")


# -- grading ------------------------------------------------------------------------------------


def grade(pred: str | None, gold: str, *, integer: bool = False) -> Grade:
    """Is ``pred`` equivalent to the reference ``gold``? Never raises.

    ``integer=True`` (integer-answer benchmarks: arithmetic, BeyondAIME) compares exact integers when
    the reference is a plain integer: the answer must be a plain integer too, or end with ``= N``
    (``53 + 52 = 105``). An expression that merely evaluates to the reference is not an answer:
    math-verify would call ``53 + 52`` equal to ``105``, and a policy trained on generated
    arithmetic learned within five steps to restate the question (held-out "accuracy" 1.0).
    References that are not plain integers take the general path.
    """
    if not isinstance(gold, str):
        gold = str(gold)
    if pred is None or not isinstance(pred, str):
        return Grade(False, "none", None, gold)
    if not pred.strip():
        return Grade(False, "none", pred, gold)
    method = "fallback" if fallback_needed(gold) else "math-verify"  # fallback_needed never raises
    try:
        if integer:
            g = _integer_digits(gold)
            if g is not None:
                p = _integer_digits(pred)
                if p is None and "=" in pred:
                    p = _integer_digits(pred.rsplit("=", 1)[1])
                return Grade(p is not None and p == g, "math-verify", pred, gold)
        if method == "fallback":
            key = _text_key(gold)
            return Grade(bool(key) and _text_key(pred) == key, method, pred, gold)
        return Grade(_math_verify_equal(pred, gold), method, pred, gold)
    except Exception:  # noqa: BLE001 - a grader crash is a wrong answer, not a crashed run
        logger.debug("grading failed for pred=%r gold=%r", pred[:200], gold[:200], exc_info=True)
        return Grade(False, method, pred, gold)


def fallback_needed(gold: str) -> bool:
    """True when math-verify cannot represent ``gold`` faithfully, so :func:`grade` compares text.

    That is: the answer contains words (a phrase, or math with a side condition), notation the
    parser mangles (ellipses, ``\\underbrace``, set-builder ``{x : ...}``), several lines (a
    piecewise answer), or math-verify parses nothing out of it.
    """
    try:
        if not isinstance(gold, str) or not gold.strip():
            return True
        if _has_words(gold) or _UNSUPPORTED_RE.search(gold) or "\n" in gold.strip():
            return True
        return not _parse(gold)
    except Exception:  # noqa: BLE001
        return True


# -- integers -----------------------------------------------------------------------------------


def _integer_digits(s: str) -> str | None:
    """Canonical digits of a plain integer, or None.

    ``"1,000"``, ``"$1000$"``, ``"\\text{1000}."``, ``"1{,}000"`` and ``"+01000"`` all give ``"1000"``.
    Strings rather than ``int`` so that answers longer than Python's int-parsing limit still compare.
    """
    t = _unwrap_commands(s.strip())
    t = re.sub(r"\\[,;!: ]|\{,\}|[\s$~]", "", t).replace("\\boxed", "")
    t = t.strip("{}").rstrip(".")
    if re.fullmatch(r"[+-]?[0-9]{1,3}(?:,[0-9]{3})+", t):
        t = t.replace(",", "")
    m = re.fullmatch(r"([+-]?)([0-9]+)", t)
    if m is None:
        return None
    digits = m.group(2).lstrip("0") or "0"
    return digits if m.group(1) != "-" or digits == "0" else "-" + digits


# -- math-verify path ---------------------------------------------------------------------------


def _math_verify_equal(pred: str, gold: str) -> bool:
    guarded = _signal_timeouts_available()
    if not guarded and (_too_risky(pred) or _too_risky(gold)):
        logger.info("not parsing a risky answer without a timeout: %r", pred[:80])
        return False
    gold_parsed = _parse(gold)
    pred_parsed = _parse(pred)
    if not gold_parsed or not pred_parsed:
        return False
    from math_verify import verify

    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=TIMEOUT_S if guarded else None))


def _parse(s: str) -> list[Any]:
    """math-verify's parse of one answer string, as LaTeX; [] when nothing parses to a sympy object."""
    from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    from sympy import Basic, MatrixBase

    guarded = _signal_timeouts_available()
    if not guarded and _too_risky(s):
        return []
    config = [
        LatexExtractionConfig(
            normalization_config=NormalizationConfig(
                basic_latex=True, units=False, malformed_operators=True, nits=True, boxed="all",
                equations=False,
            )
        ),
        ExprExtractionConfig(),
    ]
    parsed = parse(_as_latex(s), extraction_config=config, parsing_timeout=TIMEOUT_S if guarded else None)
    # parse() appends the raw matched string as a last resort; only sympy objects count as parsed.
    return [p for p in parsed if isinstance(p, (Basic, MatrixBase))]


def _as_latex(s: str) -> str:
    """One inline-math string for the parser: ``$`` and ``\\( \\)`` delimiters merged, period dropped."""
    t = s.strip()
    t = re.sub(r"\\[()\[\]]", " ", t).replace("$", " ")
    t = t.strip().rstrip(".").strip()
    # `7^d p` is 7^d times p in LaTeX, but the parser reads a symbol `dp`: brace one-letter exponents.
    t = re.sub(r"\^\s*([A-Za-z])(?![A-Za-z])", r"^{\1}", t)
    return f"${_split_case_collisions(t)}$"


def _split_case_collisions(latex: str) -> str:
    """Rename ``R`` to ``R_{U}`` when ``r`` also appears, so lowercasing cannot merge them."""
    visible = _VERBATIM_RE.sub(" ", latex)
    letters = set(re.findall(r"[A-Za-z]", _COMMAND_RE.sub(" ", visible)))
    clashing = {c for c in letters if c.isupper() and c.lower() in letters}
    if not clashing:
        return latex

    def rename(m: re.Match[str]) -> str:
        if m.group("letter") and m.group("letter") in clashing:
            return m.group("letter") + "_{U}"
        return m.group(0)

    return re.sub(
        r"(?P<skip>\\(?:text|mathrm|mathbb|mathcal|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+)"
        r"|(?P<letter>[A-Z])(?!_)",
        rename,
        latex,
    )


_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_VERBATIM_RE = re.compile(r"\\(?:text|mathrm|mathbb|mathcal|operatorname)\s*\{[^{}]*\}")


def _signal_timeouts_available() -> bool:
    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


def _too_risky(s: str) -> bool:
    """Inputs that could stall sympy with no timeout: very long, huge numeric powers or factorials."""
    if len(s) > MAX_UNGUARDED_CHARS:
        return True
    # a^{b^{c}} with numbers: the exponent b^c has c*log10(b) digits; past 5 digits the power
    # itself has over 100,000 digits.
    for b, c in re.findall(r"\d\s*\^\s*\{?\s*(\d+)\s*\^\s*\{?\s*(\d+)", s):
        if int(c) * math.log10(max(int(b), 2)) > 5:
            return True
    return (
        re.search(r"\d\s*(?:\*\*|\^)\s*[{(]?\s*\d{7,}", s) is not None  # 2^{10000000}
        or re.search(r"\d{5,}\s*\)?\s*!", s) is not None  # 100000!
    )


# -- fallback path ------------------------------------------------------------------------------

# Words that mark a phrase (short ones listed; any letter run of 5+ outside a command counts too,
# except the function names below). Single letters and short runs like `pq`, `Rr`, `st` are math.
_SHORT_WORDS = frozenset(
    "is if or of no and for all the are any not but odd set with some none such that when form even "
    "each only zero one two three four five six seven eight nine ten card".split()
)
_MATH_WORDS = frozenset(
    "floor ceil sqrt binom choose infty lambda alpha gamma delta theta sigma omega".split()
)
# Notation the parser silently mangles: ellipses (`1,2,\ldots,1235` -> {1, 2, 1235}), braces
# under/over an expression, set-builder sets `\{(a,b) : ...\}`.
_UNSUPPORTED_RE = re.compile(
    r"\\(?:l?dots|cdots|ldots|vdots|underbrace|overbrace|mid)\b|\.\.\.|…"
    r"|(?:\\\{|\\lbrace)[^}]*?(?::|\\mid)"
)


def _has_words(s: str) -> bool:
    visible = _COMMAND_RE.sub(" ", s.replace("\\text", " ").replace("\\mathrm", " "))
    for word in re.findall(r"[A-Za-z]+", visible):
        w = word.lower()
        if w in _SHORT_WORDS or (len(w) >= 5 and w not in _MATH_WORDS):
            return True
    return False


_EMPTY_ANSWERS = frozenset(
    {
        "none", "no solution", "no solutions", "no such", "no such n", "no such integer", "no such integers",
        "no such number", "no such numbers", "no positive integers", "no integers", "there are none",
        "there is no solution", "there are no solutions", "no n", "empty set", "\\emptyset", "\\varnothing",
        "∅", "{}",
    }
)
_PROPERTY = r"(?P<adj>odd|even|prime|composite)"
_NOUN = r"(?:\s+(?:integers?|numbers?))?"
_PROPERTY_FORMS = (
    re.compile(rf"^{_PROPERTY}{_NOUN}\s+(?P<var>[a-z])$"),  # odd n, odd integers n
    # n odd, n is odd, n is an odd integer
    re.compile(rf"^(?P<var>[a-z])\s+(?:(?:is|must be)\s+(?:an?\s+)?)?{_PROPERTY}{_NOUN}$"),
)
# "powers of 2" = "n is a power of 2"
_POWER_FORMS = re.compile(r"^(?:[a-z]\s+is\s+an?\s+)?(?P<what>power|multiple)s?\s+of\s+(?P<base>\w+)$")


def _text_key(s: str) -> str:
    """A normal form for text answers; two answers match when their keys are equal."""
    t = s.strip()
    t = _unwrap_commands(t)
    t = re.sub(r"\\[()\[\]]", " ", t).replace("$", " ")
    t = re.sub(r"\\(?:left|right|displaystyle)(?![A-Za-z])", "", t)
    t = re.sub(r"\\[,;:! ]|~", " ", t)
    t = re.sub(r"\\(?:l?dots|cdots|ldots)(?![A-Za-z])|…", "...", t)
    t = re.sub(r"\\(?:leq?|leqslant)(?![A-Za-z])|≤", "<=", t)
    t = re.sub(r"\\(?:geq?|geqslant)(?![A-Za-z])|≥", ">=", t)
    t = re.sub(r"\\(?:neq?)(?![A-Za-z])|≠", "!=", t)
    t = t.replace("\\{", "{").replace("\\}", "}").replace("**", "")
    t = t.lower()
    t = re.sub(r"\s+", " ", t).strip()
    t = re.sub(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is\b\s*:?|:)\s*", "", t)
    t = re.sub(r"(?<!\.)\.$", "", t).strip()  # a closing period, not the end of an ellipsis
    t = re.sub(r"([\^_])\{(\w)\}", r"\1\2", t)  # 2^{n} -> 2^n
    t = re.sub(r"\s*([^\w\s])\s*", r"\1", t)  # spaces only matter between words
    t = re.sub(r"^all\s+", "", t)
    if t in _EMPTY_ANSWERS:
        return "∅"
    for form in _PROPERTY_FORMS:
        m = form.match(t)
        if m:
            return f"{m.group('var')} is {m.group('adj')}"
    m = _POWER_FORMS.match(t)
    if m:
        return f"{m.group('what')}s of {m.group('base')}"
    return t


def _unwrap_commands(t: str) -> str:
    """``\\text{odd } n`` -> ``odd  n``: drop text-style wrappers but keep what they wrap."""
    pattern = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
    prev = None
    while prev != t:
        prev = t
        t = pattern.sub(r" \1 ", t)
    return t
