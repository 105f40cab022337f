"""The built-in code set: 48 small function-writing and stdin/stdout problems with tests, generated
deterministically from reference solutions (``task.type=code`` with no ``task.path``).

Each function problem gives a name, a signature, a one-sentence description, a reference body and
five argument tuples; the expected values are the reference's own results, written into ``assert``
tests (``f(args) == expected``). The first three tests are public (the first also appears in the
prompt as an example), the last two hidden. Stdin/stdout problems give a reference ``solve(text)``
and five inputs. Interpretation: problems at the level of the first MBPP items, so that a 135M
chat model solves some of them and RL has a signal; the point is the pipeline, not a benchmark.
"""

from __future__ import annotations

from typing import Any, Callable

# (name, params, description, reference body (uses the params), inputs)
FUNCTIONS: list[tuple[str, str, str, str, list[tuple]]] = [
    ("add", "a, b", "returns the sum of a and b", "return a + b", [(1, 2), (0, 0), (-3, 5), (10, 20), (7, -7)]),
    ("subtract", "a, b", "returns a minus b", "return a - b", [(5, 3), (0, 4), (-2, -2), (10, 1), (3, 9)]),
    ("multiply", "a, b", "returns the product of a and b", "return a * b", [(2, 3), (0, 5), (-1, 4), (6, 6), (9, -2)]),
    ("square", "x", "returns x squared", "return x * x", [(3,), (0,), (-4,), (10,), (7,)]),
    ("cube", "x", "returns x cubed", "return x ** 3", [(2,), (0,), (-3,), (5,), (1,)]),
    ("double", "x", "returns twice x", "return 2 * x", [(4,), (0,), (-5,), (21,), (13,)]),
    ("is_even", "n", "returns True if n is even, else False", "return n % 2 == 0", [(4,), (7,), (0,), (-2,), (11,)]),
    ("is_odd", "n", "returns True if n is odd, else False", "return n % 2 == 1", [(3,), (8,), (1,), (10,), (-3,)]),
    ("absolute", "x", "returns the absolute value of x", "return abs(x)", [(-5,), (3,), (0,), (-12,), (8,)]),
    ("maximum", "a, b", "returns the larger of a and b", "return max(a, b)", [(3, 7), (9, 2), (5, 5), (-1, -4), (0, 1)]),
    ("minimum", "a, b", "returns the smaller of a and b", "return min(a, b)", [(3, 7), (9, 2), (5, 5), (-1, -4), (0, 1)]),
    ("list_sum", "xs", "returns the sum of the numbers in the list xs", "return sum(xs)",
     [([1, 2, 3],), ([],), ([5],), ([-1, 1, 10],), ([4, 4, 4, 4],)]),
    ("list_max", "xs", "returns the largest number in the non-empty list xs", "return max(xs)",
     [([1, 5, 3],), ([7],), ([-2, -9],), ([4, 4, 2],), ([0, 10, 5],)]),
    ("list_min", "xs", "returns the smallest number in the non-empty list xs", "return min(xs)",
     [([1, 5, 3],), ([7],), ([-2, -9],), ([4, 4, 2],), ([0, 10, 5],)]),
    ("count_items", "xs", "returns how many items the list xs has", "return len(xs)",
     [([1, 2, 3],), ([],), (["a"],), ([0, 0],), ([1, 2, 3, 4, 5],)]),
    ("average", "xs", "returns the average (mean) of the non-empty list of numbers xs", "return sum(xs) / len(xs)",
     [([1, 2, 3],), ([4],), ([2, 4],), ([10, 0, 5],), ([1, 1, 1, 5],)]),
    ("reverse_string", "s", "returns the string s reversed", "return s[::-1]",
     [("abc",), ("",), ("racecar",), ("hello",), ("ab",)]),
    ("string_length", "s", "returns the number of characters in s", "return len(s)",
     [("abc",), ("",), ("hello world",), ("x",), ("python",)]),
    ("to_upper", "s", "returns s in upper case", "return s.upper()", [("abc",), ("Hello",), ("",), ("x1y",), ("UP",)]),
    ("to_lower", "s", "returns s in lower case", "return s.lower()", [("ABC",), ("Hello",), ("",), ("X1Y",), ("low",)]),
    ("first_char", "s", "returns the first character of the non-empty string s", "return s[0]",
     [("abc",), ("x",), ("hello",), ("Zebra",), ("42",)]),
    ("last_char", "s", "returns the last character of the non-empty string s", "return s[-1]",
     [("abc",), ("x",), ("hello",), ("Zebra",), ("42",)]),
    ("count_vowels", "s", "returns how many of the characters of s are vowels (a, e, i, o, u; lower case)",
     "return sum(c in 'aeiou' for c in s)", [("hello",), ("sky",), ("aeiou",), ("",), ("banana",)]),
    ("is_palindrome", "s", "returns True if s reads the same forwards and backwards, else False", "return s == s[::-1]",
     [("racecar",), ("hello",), ("",), ("abba",), ("ab",)]),
    ("repeat_string", "s, n", "returns s repeated n times", "return s * n", [("ab", 3), ("x", 0), ("", 5), ("hi", 1), ("z", 4)]),
    ("concat", "a, b", "returns the string a followed by the string b", "return a + b",
     [("ab", "cd"), ("", "x"), ("hello ", "world"), ("1", "2"), ("", "")]),
    ("factorial", "n", "returns n! (the product 1 * 2 * ... * n; 0! is 1)",
     "r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r", [(0,), (1,), (5,), (3,), (7,)]),
    ("fibonacci", "n", "returns the n-th Fibonacci number, where fibonacci(0) == 0 and fibonacci(1) == 1",
     "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a", [(0,), (1,), (7,), (10,), (2,)]),
    ("sum_to_n", "n", "returns 1 + 2 + ... + n (0 when n is 0)", "return n * (n + 1) // 2", [(3,), (0,), (10,), (1,), (100,)]),
    ("is_positive", "x", "returns True if x is greater than 0, else False", "return x > 0", [(3,), (-2,), (0,), (100,), (-1,)]),
    ("sign", "x", "returns 1 if x > 0, -1 if x < 0 and 0 if x == 0", "return (x > 0) - (x < 0)", [(5,), (-3,), (0,), (-100,), (1,)]),
    ("celsius_to_fahrenheit", "c", "returns the temperature c (degrees Celsius) in degrees Fahrenheit",
     "return c * 9 / 5 + 32", [(0,), (100,), (-40,), (25,), (20,)]),
    ("remainder", "a, b", "returns the remainder of a divided by b", "return a % b", [(7, 3), (10, 5), (4, 7), (9, 2), (100, 7)]),
    ("power", "base, exp", "returns base raised to the power exp", "return base ** exp", [(2, 3), (5, 0), (3, 2), (10, 3), (1, 9)]),
    ("even_numbers", "xs", "returns a list of the even numbers of xs, in order", "return [x for x in xs if x % 2 == 0]",
     [([1, 2, 3, 4],), ([],), ([1, 3],), ([2, 2, 5],), ([0, 7, 8],)]),
    ("double_all", "xs", "returns a new list with every number of xs doubled", "return [2 * x for x in xs]",
     [([1, 2, 3],), ([],), ([0],), ([-1, 5],), ([10, 20],)]),
    ("contains", "xs, x", "returns True if x is in the list xs, else False", "return x in xs",
     [([1, 2, 3], 2), ([], 1), ([5], 6), (["a", "b"], "b"), ([0, 0], 1)]),
    ("count_occurrences", "xs, x", "returns how many times x appears in the list xs", "return xs.count(x)",
     [([1, 2, 1], 1), ([], 3), ([5, 5, 5], 5), (["a", "b"], "c"), ([0, 1, 0, 1], 0)]),
    ("first_element", "xs", "returns the first element of the non-empty list xs", "return xs[0]",
     [([1, 2, 3],), (["x"],), ([0, 9],), ([7, 7],), ([-1],)]),
    ("sort_list", "xs", "returns a new list with the numbers of xs in increasing order", "return sorted(xs)",
     [([3, 1, 2],), ([],), ([5],), ([2, 2, 1],), ([9, -1, 4, 0],)]),
]

# (name, description, reference solve(text) -> output text, inputs)
IO_PROBLEMS: list[tuple[str, str, Callable[[str], str], list[str]]] = [
    ("io_sum", "The input is one line with two integers separated by a space. Print their sum.",
     lambda t: f"{sum(map(int, t.split()))}\n", ["1 2\n", "0 0\n", "-5 10\n", "100 200\n", "7 -8\n"]),
    ("io_product", "The input is one line with two integers separated by a space. Print their product.",
     lambda t: f"{int(t.split()[0]) * int(t.split()[1])}\n", ["2 3\n", "0 9\n", "-4 5\n", "10 10\n", "7 1\n"]),
    ("io_reverse", "The input is one line of text. Print it reversed.",
     lambda t: t.rstrip("\n")[::-1] + "\n", ["abc\n", "hello\n", "x\n", "racecar\n", "12345\n"]),
    ("io_upper", "The input is one line of text. Print it in upper case.",
     lambda t: t.rstrip("\n").upper() + "\n", ["abc\n", "Hello World\n", "x\n", "a1b2\n", "ok\n"]),
    ("io_square", "The input is one integer. Print its square.",
     lambda t: f"{int(t) ** 2}\n", ["3\n", "0\n", "-4\n", "12\n", "1\n"]),
    ("io_count_words", "The input is one line of words separated by spaces. Print how many words it has.",
     lambda t: f"{len(t.split())}\n", ["hello world\n", "one\n", "a b c d\n", "the quick brown fox\n", "x y\n"]),
    ("io_max", "The input is one line of integers separated by spaces. Print the largest.",
     lambda t: f"{max(map(int, t.split()))}\n", ["1 5 3\n", "7\n", "-2 -9\n", "4 4 2\n", "0 10 5\n"]),
    ("io_echo_lines", "The input is a number n on the first line, then n lines of text. Print the n lines in reverse order.",
     lambda t: "".join(ln + "\n" for ln in t.splitlines()[1:][::-1]),
     ["2\na\nb\n", "1\nx\n", "3\none\ntwo\nthree\n", "2\nhello\nworld\n", "1\n42\n"]),
]

PUBLIC_TESTS = 3
"""Tests 1–3 of each problem are public (named in feedback), 4–5 hidden."""


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _function_rows() -> list[dict[str, Any]]:
    rows = []
    for name, params, desc, body, inputs in FUNCTIONS:
        ns: dict[str, Any] = {}
        exec(f"def {name}({params}):\n    {body}\n", ns)  # noqa: S102 - our own reference solutions
        tests = [{"assert": f"{_call(name, args)} == {ns[name](*args)!r}", "hidden": k >= PUBLIC_TESTS}
                 for k, args in enumerate(inputs)]
        example = tests[0]["assert"]
        prompt = f"Write a Python function `{name}({params})` that {desc}.\nFor example: `{example}`."
        rows.append({"id": name, "prompt": prompt, "entry_point": name, "tests": tests})
    return rows


def _io_rows() -> list[dict[str, Any]]:
    rows = []
    for name, desc, solve, inputs in IO_PROBLEMS:
        tests = [{"stdin": t, "stdout": solve(t), "hidden": k >= PUBLIC_TESTS} for k, t in enumerate(inputs)]
        ex_in, ex_out = inputs[0].rstrip("\n"), tests[0]["stdout"].rstrip("\n")
        prompt = (f"Write a Python program that reads standard input. {desc}\n"
                  f"For example, for the input `{ex_in}` it prints `{ex_out}`.")
        rows.append({"id": name, "prompt": prompt, "tests": tests})
    return rows


def builtin_rows() -> list[dict[str, Any]]:
    """The 48 problems as rows of the code JSONL format (``docs/code_rewards.md``), in a fixed order:
    40 function problems, then 8 stdin/stdout problems."""
    return _function_rows() + _io_rows()
