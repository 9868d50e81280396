"""Build the local SWE tasks: small Python repositories with real bugs, in SWE-bench's schema.

Each task is a git repository with two commits: the *base commit* (the bug, with the tests that
pass before the fix) and a later *fix commit* (the gold patch plus the tests that show the bug).
Its Docker image, ``FROM sao-base:bookworm-v1``, holds the repository at ``/testbed`` checked
out at the base commit, with the fix commit still reachable from a tag, a remote-tracking
branch, ``ORIG_HEAD`` and the reflog, as in a fresh clone of an upstream project. That makes the
environment's history hiding testable: after it, the fix commit must be gone.

The instances file (``instances.jsonl``) has SWE-bench's fields plus ``test_cmd``,
``log_parser`` and ``image`` (what the environment needs for repositories swebench's specs do
not know) and ``fix_commit`` (for tests of history hiding; the environment never shows it).
``FAIL_TO_PASS``/``PASS_TO_PASS`` are pytest node ids as swebench's ``parse_log_pytest`` reports
them. They are declared below and checked against real runs whenever a task is (re)built: the
FAIL_TO_PASS tests must fail at the base commit with the test patch and pass with the gold
patch; the PASS_TO_PASS tests must pass in both.

Idempotent and cached: commits are deterministic (fixed author, dates and config), and an
image is tagged ``<prefix>/<name>:<key>`` where ``key`` hashes the task's content, the builder
version and the base image id. A task whose image and cached row exist is not touched again.
Each image adds one layer of a few KB to the base image.

Run as a module (``python -m sao.envs.swebench.local_tasks [OUT_DIR]``, ``--help`` for the options) or call
:func:`build`; the environment ``swe-local`` calls it through :func:`sao.envs.swebench.build_local_tasks`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("sao.swe_tasks")

BUILDER_VERSION = "2"
TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
LOG_PARSER = "parse_log_pytest"
IMAGE_LABEL = "io.sao.swe-local"
"""Label on every image built here (value: the task name); find them with ``docker images -f label=...``."""
COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "SAO Tasks", "GIT_AUTHOR_EMAIL": "tasks@sao.invalid",
    "GIT_COMMITTER_NAME": "SAO Tasks", "GIT_COMMITTER_EMAIL": "tasks@sao.invalid",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
}
BASE_DATE = "2024-01-15T10:00:00+00:00"
FIX_DATE = "2024-02-20T16:30:00+00:00"
GITIGNORE = "__pycache__/\n*.pyc\n.pytest_cache/\n"


class BuildError(RuntimeError):
    """A task could not be built, or its tests do not behave as declared."""


@dataclass(frozen=True)
class LocalTask:
    """One task. ``base`` is the tree at the base commit; the fix commit changes ``fix`` (the gold
    patch: source files) and ``tests`` (the test patch) on top of it."""

    name: str
    problem_statement: str
    base: dict[str, str]
    fix: dict[str, str]
    tests: dict[str, str]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]

    @property
    def instance_id(self) -> str:
        return f"sao-local__{self.name}-1"

    @property
    def repo(self) -> str:
        return f"sao-local/{self.name}"

    def content_key(self) -> str:
        blob = json.dumps([BUILDER_VERSION, self.name, self.problem_statement, self.base, self.fix, self.tests,
                           self.fail_to_pass, self.pass_to_pass, TEST_CMD, BASE_DATE, FIX_DATE, GITIGNORE],
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# -- the tasks ----------------------------------------------------------------------------------

INTERVALS = LocalTask(
    name="intervals",
    problem_statement=_src("""
        `merge` keeps touching intervals apart

        `intervals.merge` is documented to merge overlapping *or touching* closed intervals, but
        intervals that share only an endpoint stay separate:

        ```python
        >>> from intervals import merge
        >>> merge([(1, 3), (3, 5)])
        [(1, 3), (3, 5)]
        ```

        Expected `[(1, 5)]`. The same happens for chains such as `[(0, 1), (1, 2), (2, 3)]`.
        """),
    base={
        "intervals/__init__.py": _src('''
            """Closed integer intervals."""

            from .core import merge, total_length

            __all__ = ["merge", "total_length"]
            '''),
        "intervals/core.py": _src('''
            def merge(intervals):
                """Merge overlapping or touching closed intervals; return them sorted by start."""
                result = []
                for start, end in sorted(intervals):
                    if start > end:
                        raise ValueError(f"interval ({start}, {end}) ends before it starts")
                    if result and start < result[-1][1]:
                        result[-1] = (result[-1][0], max(result[-1][1], end))
                    else:
                        result.append((start, end))
                return result


            def total_length(intervals):
                """Length of the union of the intervals."""
                return sum(end - start for start, end in merge(intervals))
            '''),
        "tests/test_intervals.py": _src('''
            import pytest

            from intervals import merge, total_length


            def test_overlapping():
                assert merge([(1, 4), (2, 6)]) == [(1, 6)]


            def test_disjoint_and_unsorted():
                assert merge([(7, 9), (1, 2)]) == [(1, 2), (7, 9)]


            def test_empty():
                assert merge([]) == []


            def test_reversed_interval_raises():
                with pytest.raises(ValueError):
                    merge([(5, 1)])


            def test_total_length():
                assert total_length([(1, 4), (2, 6), (10, 11)]) == 6
            '''),
    },
    fix={
        "intervals/core.py": _src('''
            def merge(intervals):
                """Merge overlapping or touching closed intervals; return them sorted by start."""
                result = []
                for start, end in sorted(intervals):
                    if start > end:
                        raise ValueError(f"interval ({start}, {end}) ends before it starts")
                    if result and start <= result[-1][1]:
                        result[-1] = (result[-1][0], max(result[-1][1], end))
                    else:
                        result.append((start, end))
                return result


            def total_length(intervals):
                """Length of the union of the intervals."""
                return sum(end - start for start, end in merge(intervals))
            '''),
    },
    tests={
        "tests/test_intervals.py": _src('''
            import pytest

            from intervals import merge, total_length


            def test_overlapping():
                assert merge([(1, 4), (2, 6)]) == [(1, 6)]


            def test_disjoint_and_unsorted():
                assert merge([(7, 9), (1, 2)]) == [(1, 2), (7, 9)]


            def test_empty():
                assert merge([]) == []


            def test_reversed_interval_raises():
                with pytest.raises(ValueError):
                    merge([(5, 1)])


            def test_total_length():
                assert total_length([(1, 4), (2, 6), (10, 11)]) == 6


            def test_touching_intervals_merge():
                assert merge([(1, 3), (3, 5)]) == [(1, 5)]


            def test_touching_chain_merges():
                assert merge([(2, 3), (0, 1), (1, 2)]) == [(0, 3)]
            '''),
    },
    fail_to_pass=("tests/test_intervals.py::test_touching_intervals_merge",
                  "tests/test_intervals.py::test_touching_chain_merges"),
    pass_to_pass=("tests/test_intervals.py::test_overlapping", "tests/test_intervals.py::test_disjoint_and_unsorted",
                  "tests/test_intervals.py::test_empty", "tests/test_intervals.py::test_reversed_interval_raises",
                  "tests/test_intervals.py::test_total_length"),
)

SEMVER = LocalTask(
    name="semver",
    problem_statement=_src("""
        Version comparison is wrong for multi-digit components

        `semver.compare("1.10.0", "1.9.0")` returns `-1`, so `max_version(["1.9.0", "1.10.0"])`
        picks `1.9.0`. Components must be compared as numbers: 1.10.0 is newer than 1.9.0.
        """),
    base={
        "semver.py": _src('''
            """Parse and compare MAJOR.MINOR.PATCH version strings."""

            import re

            _VERSION = re.compile(r"^(\\d+)\\.(\\d+)\\.(\\d+)$")


            def parse(version):
                """Split a version into its three components."""
                match = _VERSION.match(version.strip())
                if not match:
                    raise ValueError(f"not a MAJOR.MINOR.PATCH version: {version!r}")
                return match.groups()


            def compare(a, b):
                """-1, 0 or 1 as version a is older than, equal to or newer than b."""
                pa, pb = parse(a), parse(b)
                return (pa > pb) - (pa < pb)


            def max_version(versions):
                """The newest of the versions."""
                best = None
                for version in versions:
                    if best is None or compare(version, best) > 0:
                        best = version
                return best
            '''),
        "tests/test_semver.py": _src('''
            import pytest

            import semver


            def test_equal_versions():
                assert semver.compare("1.2.3", " 1.2.3") == 0


            def test_major_decides():
                assert semver.compare("2.0.0", "1.9.9") == 1
                assert semver.compare("1.9.9", "2.0.0") == -1


            def test_invalid_version_raises():
                with pytest.raises(ValueError):
                    semver.parse("1.2")


            def test_max_version_simple():
                assert semver.max_version(["1.0.1", "1.0.3", "1.0.2"]) == "1.0.3"
            '''),
    },
    fix={
        "semver.py": _src('''
            """Parse and compare MAJOR.MINOR.PATCH version strings."""

            import re

            _VERSION = re.compile(r"^(\\d+)\\.(\\d+)\\.(\\d+)$")


            def parse(version):
                """Split a version into its three components."""
                match = _VERSION.match(version.strip())
                if not match:
                    raise ValueError(f"not a MAJOR.MINOR.PATCH version: {version!r}")
                return tuple(int(part) for part in match.groups())


            def compare(a, b):
                """-1, 0 or 1 as version a is older than, equal to or newer than b."""
                pa, pb = parse(a), parse(b)
                return (pa > pb) - (pa < pb)


            def max_version(versions):
                """The newest of the versions."""
                best = None
                for version in versions:
                    if best is None or compare(version, best) > 0:
                        best = version
                return best
            '''),
    },
    tests={
        "tests/test_numeric_order.py": _src('''
            import semver


            def test_minor_compares_numerically():
                assert semver.compare("1.10.0", "1.9.0") == 1


            def test_patch_compares_numerically():
                assert semver.compare("0.0.9", "0.0.10") == -1


            def test_max_version_numeric():
                assert semver.max_version(["1.9.0", "1.10.0", "1.2.0"]) == "1.10.0"
            '''),
    },
    fail_to_pass=("tests/test_numeric_order.py::test_minor_compares_numerically",
                  "tests/test_numeric_order.py::test_patch_compares_numerically",
                  "tests/test_numeric_order.py::test_max_version_numeric"),
    pass_to_pass=("tests/test_semver.py::test_equal_versions", "tests/test_semver.py::test_major_decides",
                  "tests/test_semver.py::test_invalid_version_raises", "tests/test_semver.py::test_max_version_simple"),
)

CSVLINE = LocalTask(
    name="csvline",
    problem_statement=_src('''
        Doubled quotes inside a quoted field are not unescaped

        RFC 4180 escapes a double quote inside a quoted field by doubling it, but
        `csvline.split_line` drops the quote and ends the field early:

        ```python
        >>> split_line('"say ""hi""",x')
        ['say hi""', 'x']
        ```

        Expected `['say "hi"', 'x']`.
        '''),
    base={
        "csvline/__init__.py": 'from .parser import split_line\n\n__all__ = ["split_line"]\n',
        "csvline/parser.py": _src('''
            def split_line(line, sep=","):
                """Split one CSV line into fields; fields may be quoted with double quotes."""
                fields, field, quoted, i = [], [], False, 0
                while i < len(line):
                    ch = line[i]
                    if quoted:
                        if ch == '"':
                            quoted = False
                        else:
                            field.append(ch)
                    elif ch == '"':
                        quoted = True
                    elif ch == sep:
                        fields.append("".join(field))
                        field = []
                    else:
                        field.append(ch)
                    i += 1
                if quoted:
                    raise ValueError("unterminated quoted field")
                fields.append("".join(field))
                return fields
            '''),
        "tests/test_split.py": _src('''
            import pytest

            from csvline import split_line


            def test_plain_fields():
                assert split_line("a,b,c") == ["a", "b", "c"]


            def test_quoted_separator():
                assert split_line('"a,b",c') == ["a,b", "c"]


            def test_empty_fields():
                assert split_line(",x,") == ["", "x", ""]


            def test_other_separator():
                assert split_line("a;b", sep=";") == ["a", "b"]


            def test_unterminated_quote_raises():
                with pytest.raises(ValueError):
                    split_line('"abc')
            '''),
    },
    fix={
        "csvline/parser.py": _src('''
            def split_line(line, sep=","):
                """Split one CSV line into fields; fields may be quoted with double quotes."""
                fields, field, quoted, i = [], [], False, 0
                while i < len(line):
                    ch = line[i]
                    if quoted:
                        if ch == '"' and line[i + 1:i + 2] == '"':
                            field.append('"')
                            i += 1
                        elif ch == '"':
                            quoted = False
                        else:
                            field.append(ch)
                    elif ch == '"':
                        quoted = True
                    elif ch == sep:
                        fields.append("".join(field))
                        field = []
                    else:
                        field.append(ch)
                    i += 1
                if quoted:
                    raise ValueError("unterminated quoted field")
                fields.append("".join(field))
                return fields
            '''),
    },
    tests={
        "tests/test_split.py": _src('''
            import pytest

            from csvline import split_line


            def test_plain_fields():
                assert split_line("a,b,c") == ["a", "b", "c"]


            def test_quoted_separator():
                assert split_line('"a,b",c') == ["a,b", "c"]


            def test_empty_fields():
                assert split_line(",x,") == ["", "x", ""]


            def test_other_separator():
                assert split_line("a;b", sep=";") == ["a", "b"]


            def test_unterminated_quote_raises():
                with pytest.raises(ValueError):
                    split_line('"abc')


            def test_doubled_quote_is_unescaped():
                assert split_line('"say ""hi""",x') == ['say "hi"', "x"]
            '''),
    },
    fail_to_pass=("tests/test_split.py::test_doubled_quote_is_unescaped",),
    pass_to_pass=("tests/test_split.py::test_plain_fields", "tests/test_split.py::test_quoted_separator",
                  "tests/test_split.py::test_empty_fields", "tests/test_split.py::test_other_separator",
                  "tests/test_split.py::test_unterminated_quote_raises"),
)

LRUCACHE = LocalTask(
    name="lrucache",
    problem_statement=_src("""
        LRUCache evicts an entry that was just read

        Reading a key should make it the most recently used, but `get` does not update the
        order, so the next `put` over capacity evicts the key that was just read:

        ```python
        cache = LRUCache(2)
        cache.put("a", 1); cache.put("b", 2)
        cache.get("a")
        cache.put("c", 3)
        cache.get("a")   # None, expected 1 ("b" should have been evicted)
        ```
        """),
    base={
        "lrucache.py": _src('''
            """A least-recently-used cache."""

            from collections import OrderedDict


            class LRUCache:
                def __init__(self, capacity):
                    if capacity < 1:
                        raise ValueError("capacity must be at least 1")
                    self.capacity = capacity
                    self._data = OrderedDict()

                def get(self, key, default=None):
                    if key not in self._data:
                        return default
                    return self._data[key]

                def put(self, key, value):
                    if key in self._data:
                        self._data.move_to_end(key)
                    self._data[key] = value
                    if len(self._data) > self.capacity:
                        self._data.popitem(last=False)

                def __len__(self):
                    return len(self._data)
            '''),
        "tests/test_lrucache.py": _src('''
            import pytest

            from lrucache import LRUCache


            def test_put_and_get():
                cache = LRUCache(2)
                cache.put("a", 1)
                assert cache.get("a") == 1


            def test_missing_key_default():
                assert LRUCache(1).get("x", default=0) == 0


            def test_evicts_oldest_insert():
                cache = LRUCache(2)
                for key, value in (("a", 1), ("b", 2), ("c", 3)):
                    cache.put(key, value)
                assert cache.get("a") is None and len(cache) == 2


            def test_capacity_must_be_positive():
                with pytest.raises(ValueError):
                    LRUCache(0)
            '''),
    },
    fix={
        "lrucache.py": _src('''
            """A least-recently-used cache."""

            from collections import OrderedDict


            class LRUCache:
                def __init__(self, capacity):
                    if capacity < 1:
                        raise ValueError("capacity must be at least 1")
                    self.capacity = capacity
                    self._data = OrderedDict()

                def get(self, key, default=None):
                    if key not in self._data:
                        return default
                    self._data.move_to_end(key)
                    return self._data[key]

                def put(self, key, value):
                    if key in self._data:
                        self._data.move_to_end(key)
                    self._data[key] = value
                    if len(self._data) > self.capacity:
                        self._data.popitem(last=False)

                def __len__(self):
                    return len(self._data)
            '''),
    },
    tests={
        "tests/test_recency.py": _src('''
            from lrucache import LRUCache


            def test_get_refreshes_recency():
                cache = LRUCache(2)
                cache.put("a", 1)
                cache.put("b", 2)
                assert cache.get("a") == 1
                cache.put("c", 3)
                assert cache.get("a") == 1
                assert cache.get("b") is None
            '''),
    },
    fail_to_pass=("tests/test_recency.py::test_get_refreshes_recency",),
    pass_to_pass=("tests/test_lrucache.py::test_put_and_get", "tests/test_lrucache.py::test_missing_key_default",
                  "tests/test_lrucache.py::test_evicts_oldest_insert",
                  "tests/test_lrucache.py::test_capacity_must_be_positive"),
)

ROMAN = LocalTask(
    name="roman",
    problem_statement=_src("""
        `to_roman` does not use the subtractive forms CM and CD

        `roman.to_roman(1994)` returns `'MDCCCCXCIV'` and `to_roman(400)` returns `'CCCC'`;
        standard numerals are `'MCMXCIV'` and `'CD'`. `from_roman` already reads them.
        """),
    base={
        "roman/__init__.py": "from .numerals import from_roman, to_roman\n\n__all__ = [\"from_roman\", \"to_roman\"]\n",
        "roman/numerals.py": _src('''
            _TABLE = [
                (1000, "M"), (500, "D"), (100, "C"), (90, "XC"),
                (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
            ]
            _VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}


            def to_roman(number):
                """The Roman numeral of 1 <= number <= 3999."""
                if not 1 <= number <= 3999:
                    raise ValueError(f"out of range: {number}")
                parts = []
                for value, symbol in _TABLE:
                    count, number = divmod(number, value)
                    parts.append(symbol * count)
                return "".join(parts)


            def from_roman(text):
                """The value of a Roman numeral (subtractive forms included)."""
                total = 0
                for i, ch in enumerate(text):
                    value = _VALUES[ch]
                    if i + 1 < len(text) and _VALUES[text[i + 1]] > value:
                        total -= value
                    else:
                        total += value
                return total
            '''),
        "tests/test_roman.py": _src('''
            import pytest

            from roman import from_roman, to_roman


            @pytest.mark.parametrize("number,numeral", [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (90, "XC")])
            def test_to_roman(number, numeral):
                assert to_roman(number) == numeral


            @pytest.mark.parametrize("numeral,number", [("MCMXCIV", 1994), ("CD", 400), ("XLII", 42)])
            def test_from_roman(numeral, number):
                assert from_roman(numeral) == number


            def test_out_of_range():
                with pytest.raises(ValueError):
                    to_roman(0)
            '''),
    },
    fix={
        "roman/numerals.py": _src('''
            _TABLE = [
                (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
            ]
            _VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}


            def to_roman(number):
                """The Roman numeral of 1 <= number <= 3999."""
                if not 1 <= number <= 3999:
                    raise ValueError(f"out of range: {number}")
                parts = []
                for value, symbol in _TABLE:
                    count, number = divmod(number, value)
                    parts.append(symbol * count)
                return "".join(parts)


            def from_roman(text):
                """The value of a Roman numeral (subtractive forms included)."""
                total = 0
                for i, ch in enumerate(text):
                    value = _VALUES[ch]
                    if i + 1 < len(text) and _VALUES[text[i + 1]] > value:
                        total -= value
                    else:
                        total += value
                return total
            '''),
    },
    tests={
        "tests/test_roman.py": _src('''
            import pytest

            from roman import from_roman, to_roman


            @pytest.mark.parametrize("number,numeral", [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (90, "XC"),
                                                        (400, "CD"), (1994, "MCMXCIV")])
            def test_to_roman(number, numeral):
                assert to_roman(number) == numeral


            @pytest.mark.parametrize("numeral,number", [("MCMXCIV", 1994), ("CD", 400), ("XLII", 42)])
            def test_from_roman(numeral, number):
                assert from_roman(numeral) == number


            def test_out_of_range():
                with pytest.raises(ValueError):
                    to_roman(0)


            def test_no_symbol_repeats_four_times():
                for n in range(1, 4000):
                    assert not any(symbol * 4 in to_roman(n) for symbol in "CXI"), n
            '''),
    },
    fail_to_pass=("tests/test_roman.py::test_to_roman[400-CD]", "tests/test_roman.py::test_to_roman[1994-MCMXCIV]",
                  "tests/test_roman.py::test_no_symbol_repeats_four_times"),
    pass_to_pass=("tests/test_roman.py::test_to_roman[1-I]", "tests/test_roman.py::test_to_roman[4-IV]",
                  "tests/test_roman.py::test_to_roman[9-IX]", "tests/test_roman.py::test_to_roman[14-XIV]",
                  "tests/test_roman.py::test_to_roman[90-XC]", "tests/test_roman.py::test_from_roman[MCMXCIV-1994]",
                  "tests/test_roman.py::test_from_roman[CD-400]", "tests/test_roman.py::test_from_roman[XLII-42]",
                  "tests/test_roman.py::test_out_of_range"),
)

PAGINATE = LocalTask(
    name="paginate",
    problem_statement=_src("""
        `Paginator.page(1)` skips the first page

        Pages are numbered from 1 (`page_count` and the error messages say so), but `page(1)`
        returns the *second* slice of items and the last page comes back empty:

        ```python
        >>> Paginator(list(range(5)), per_page=2).page(1)
        [2, 3]
        ```

        Expected `[0, 1]`; `page(3)` should be `[4]`.
        """),
    base={
        "pager/__init__.py": "from .paginator import Paginator\n\n__all__ = [\"Paginator\"]\n",
        "pager/validation.py": _src('''
            def check_positive(name, value):
                if not isinstance(value, int) or value < 1:
                    raise ValueError(f"{name} must be a positive integer, got {value!r}")
                return value
            '''),
        "pager/paginator.py": _src('''
            from .validation import check_positive


            class Paginator:
                """Splits a sequence into pages numbered 1..page_count."""

                def __init__(self, items, per_page):
                    self.items = list(items)
                    self.per_page = check_positive("per_page", per_page)

                @property
                def page_count(self):
                    return max(1, -(-len(self.items) // self.per_page))

                def page(self, number):
                    check_positive("page number", number)
                    if number > self.page_count:
                        raise ValueError(f"page {number} is past the last page ({self.page_count})")
                    start = number * self.per_page
                    return self.items[start:start + self.per_page]
            '''),
        "tests/test_paginator.py": _src('''
            import pytest

            from pager import Paginator


            def test_page_count():
                assert Paginator(range(5), per_page=2).page_count == 3
                assert Paginator([], per_page=3).page_count == 1


            def test_page_zero_is_rejected():
                with pytest.raises(ValueError):
                    Paginator(range(5), per_page=2).page(0)


            def test_page_past_the_end_is_rejected():
                with pytest.raises(ValueError):
                    Paginator(range(5), per_page=2).page(4)


            def test_per_page_must_be_positive():
                with pytest.raises(ValueError):
                    Paginator(range(5), per_page=0)
            '''),
    },
    fix={
        "pager/paginator.py": _src('''
            from .validation import check_positive


            class Paginator:
                """Splits a sequence into pages numbered 1..page_count."""

                def __init__(self, items, per_page):
                    self.items = list(items)
                    self.per_page = check_positive("per_page", per_page)

                @property
                def page_count(self):
                    return max(1, -(-len(self.items) // self.per_page))

                def page(self, number):
                    check_positive("page number", number)
                    if number > self.page_count:
                        raise ValueError(f"page {number} is past the last page ({self.page_count})")
                    start = (number - 1) * self.per_page
                    return self.items[start:start + self.per_page]
            '''),
    },
    tests={
        "tests/test_paginator.py": _src('''
            import pytest

            from pager import Paginator


            def test_page_count():
                assert Paginator(range(5), per_page=2).page_count == 3
                assert Paginator([], per_page=3).page_count == 1


            def test_page_zero_is_rejected():
                with pytest.raises(ValueError):
                    Paginator(range(5), per_page=2).page(0)


            def test_page_past_the_end_is_rejected():
                with pytest.raises(ValueError):
                    Paginator(range(5), per_page=2).page(4)


            def test_per_page_must_be_positive():
                with pytest.raises(ValueError):
                    Paginator(range(5), per_page=0)


            def test_first_page():
                assert Paginator(range(5), per_page=2).page(1) == [0, 1]


            def test_last_page_is_partial():
                assert Paginator(range(5), per_page=2).page(3) == [4]
            '''),
    },
    fail_to_pass=("tests/test_paginator.py::test_first_page", "tests/test_paginator.py::test_last_page_is_partial"),
    pass_to_pass=("tests/test_paginator.py::test_page_count", "tests/test_paginator.py::test_page_zero_is_rejected",
                  "tests/test_paginator.py::test_page_past_the_end_is_rejected",
                  "tests/test_paginator.py::test_per_page_must_be_positive"),
)

TASKS: tuple[LocalTask, ...] = (INTERVALS, SEMVER, CSVLINE, LRUCACHE, ROMAN, PAGINATE)


# -- building -----------------------------------------------------------------------------------


def build(out_dir: Path, *, image_tag_prefix: str = "sao-swe-local", tasks: tuple[LocalTask, ...] | None = None,
          label: str = "sao-swe-build", validate: bool = True, client: Any = None) -> Path:
    """Build every task (repository, image, instance row) under ``out_dir``; return the instances file.

    ``tasks`` defaults to :data:`TASKS`.
    ``label`` is the ``io.sao.sandbox`` label value of the containers that validate the tests.
    ``validate=False`` skips the test runs of freshly built tasks (not recommended).
    """
    from sao.sandboxes import ensure_base_image
    from sao.sandboxes.docker import connect

    out_dir = Path(out_dir).expanduser().resolve()
    (out_dir / "rows").mkdir(parents=True, exist_ok=True)
    own = client is None
    client = connect(client)
    try:
        base_image = ensure_base_image(client)
        base_id = client.images.get(base_image).id
        rows = [_build_task(task, out_dir, image_tag_prefix, base_image, base_id, client, label, validate)
                for task in (TASKS if tasks is None else tasks)]
    finally:
        if own:
            client.close()
    path = out_dir / "instances.jsonl"
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return path


def _build_task(task: LocalTask, out_dir: Path, prefix: str, base_image: str, base_id: str, client: Any,
                label: str, validate: bool) -> dict[str, Any]:
    import docker.errors

    dockerfile = f"FROM {base_image}\nCOPY testbed /testbed\nWORKDIR /testbed\n"
    key = hashlib.sha256(f"{task.content_key()}|{base_id}|{dockerfile}".encode()).hexdigest()[:12]
    image = f"{prefix}/{task.name}:{key}"
    row_path = out_dir / "rows" / f"{task.name}-{key}.json"
    try:
        client.images.get(image)
        have_image = True
    except docker.errors.ImageNotFound:
        have_image = False
    if have_image and row_path.exists():
        return json.loads(row_path.read_text(encoding="utf-8"))

    started = time.monotonic()
    context = out_dir / "context" / task.name
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    repo = context / "testbed"
    base_commit, fix_commit, gold, test_patch = _make_repo(task, repo)
    (context / "Dockerfile").write_text(dockerfile, encoding="utf-8")
    if not have_image:
        try:
            client.images.build(path=str(context), tag=image, rm=True, forcerm=True, pull=False,
                                labels={IMAGE_LABEL: task.name, f"{IMAGE_LABEL}.key": key})
        except docker.errors.BuildError as exc:
            tail = "".join(str(chunk.get("stream", chunk)) for chunk in list(exc.build_log)[-20:])
            raise BuildError(f"{task.name}: docker build of {image} failed: {exc}\n{tail}") from exc
    row = {
        "instance_id": task.instance_id, "repo": task.repo, "base_commit": base_commit,
        "problem_statement": task.problem_statement, "patch": gold, "test_patch": test_patch,
        "FAIL_TO_PASS": list(task.fail_to_pass), "PASS_TO_PASS": list(task.pass_to_pass),
        "version": "0.1", "environment_setup_commit": base_commit, "created_at": BASE_DATE, "hints_text": "",
        "test_cmd": TEST_CMD, "log_parser": LOG_PARSER, "image": image, "fix_commit": fix_commit,
    }
    if validate:
        _validate(task, row, client, label)
    tmp = row_path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(row, sort_keys=True, indent=1), encoding="utf-8")
    tmp.replace(row_path)
    log.info("built %s (%s) in %.1f s", task.name, image, time.monotonic() - started)
    return row


def _git(repo: Path, *args: str, date: str = BASE_DATE) -> str:
    env = {**os.environ, **COMMIT_ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    proc = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.strip()}")
    return proc.stdout


def _write(repo: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(0o644)


def _make_repo(task: LocalTask, repo: Path) -> tuple[str, str, str, str]:
    """The repository at the base commit, with the fix commit reachable as upstream has it."""
    overlap = set(task.fix) & set(task.tests)
    if overlap:
        raise BuildError(f"{task.name}: files both in the fix and in the tests: {sorted(overlap)}")
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main", "--template=")  # no sample hooks: a smaller layer
    _write(repo, {".gitignore": GITIGNORE, **task.base})
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"{task.name}: initial version")
    base = _git(repo, "rev-parse", "HEAD").strip()
    _write(repo, {**task.fix, **task.tests})
    _git(repo, "add", "-A", date=FIX_DATE)
    _git(repo, "commit", "-q", "-m", f"{task.name}: fix the reported bug and test it", date=FIX_DATE)
    fix = _git(repo, "rev-parse", "HEAD").strip()
    # As a clone of upstream would have it: the fix on the remote branch, in a tag, in the reflog.
    _git(repo, "remote", "add", "origin", f"https://git.invalid/sao-local/{task.name}.git")
    _git(repo, "update-ref", "refs/remotes/origin/main", fix)
    _git(repo, "tag", "v0.2.0", fix)
    _git(repo, "reset", "-q", "--hard", base)  # leaves ORIG_HEAD and a reflog entry at the fix
    gold = _git(repo, "diff", "--no-color", "--no-renames", base, fix, "--", *sorted(task.fix))
    test_patch = _git(repo, "diff", "--no-color", "--no-renames", base, fix, "--", *sorted(task.tests))
    return base, fix, gold, test_patch


_VALIDATE = r"""
set -u
cd /testbed
run() { echo "== $1"; shift; python3 -m pytest -rA -p no:cacheprovider tests 2>&1; }
git cat-file -e "$1^{commit}" || { echo "NO FIX COMMIT"; exit 3; }
[ "$(git rev-parse HEAD)" = "$2" ] || { echo "HEAD IS NOT THE BASE COMMIT"; exit 3; }
git apply /tmp/test.patch || { echo "TEST PATCH DOES NOT APPLY"; exit 3; }
run before > /tmp/before.log
git apply /tmp/gold.patch || { echo "GOLD PATCH DOES NOT APPLY"; exit 3; }
run after > /tmp/after.log
echo OK
"""


def _validate(task: LocalTask, row: dict[str, Any], client: Any, label: str) -> None:
    """Run the tests at the base commit with the test patch, then with the gold patch too."""
    from swebench.harness.log_parsers.python import parse_log_pytest

    from sao.sandboxes import DockerSandbox, SandboxLimits

    limits = SandboxLimits(cpus=1.0, memory_mb=512, pids=128, default_timeout_s=120)
    with DockerSandbox(row["image"], limits=limits, label=label, client=client, workdir="/testbed",
                       name_prefix="sao-swe-build-") as sb:
        sb.write_file("/tmp/test.patch", row["test_patch"])
        sb.write_file("/tmp/gold.patch", row["patch"])
        script = f"sh -c {shlex.quote(_VALIDATE)} validate {row['fix_commit']} {row['base_commit']}"
        result = sb.run(script)
        if result.exit_code != 0 or "OK" not in result.output:
            raise BuildError(f"{task.name}: validation failed (exit {result.exit_code}):\n{result.output[-2000:]}")
        before = parse_log_pytest(sb.read_file("/tmp/before.log").decode(errors="replace"), None)
        after = parse_log_pytest(sb.read_file("/tmp/after.log").decode(errors="replace"), None)
    f2p = {t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED"}
    p2p = {t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED"}
    broken = {t: s for t, s in after.items() if s != "PASSED"}
    problems = []
    if broken:
        problems.append(f"tests not passing with the gold patch: {broken}")
    if f2p != set(task.fail_to_pass):
        problems.append(f"FAIL_TO_PASS is {sorted(f2p)}, declared {sorted(task.fail_to_pass)}")
    if p2p != set(task.pass_to_pass):
        problems.append(f"PASS_TO_PASS is {sorted(p2p)}, declared {sorted(task.pass_to_pass)}")
    if problems:
        raise BuildError(f"{task.name}: the tests do not behave as declared: " + "; ".join(problems))


def default_out_dir() -> Path:
    """Where the environment ``swe-local`` looks for the tasks (see ``sao.envs.swebench.local_tasks_dir``)."""
    from .factories import local_tasks_dir

    return local_tasks_dir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=None,
                        help="output folder (default: the swe-local cache folder)")
    parser.add_argument("--image-tag-prefix", default="sao-swe-local")
    parser.add_argument("--no-validate", action="store_true", help="skip the test runs of freshly built tasks")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.monotonic()
    path = build(args.out_dir or default_out_dir(), image_tag_prefix=args.image_tag_prefix,
                 validate=not args.no_validate)
    print(f"{path} ({len(TASKS)} tasks, {time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
