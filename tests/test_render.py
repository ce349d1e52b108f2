"""The Markdown renderer: every construct in every dialect, escaping, splitting, previews."""

from __future__ import annotations

import logging
import re
from html import unescape
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pluto.gateway.delivery.render as render_pkg
from pluto.gateway.delivery.render import render, render_chunks, render_preview
from pluto.providers.discord.markup import DISCORD
from pluto.providers.slack.markup import SLACK_MRKDWN
from pluto.providers.telegram.markup import TELEGRAM_HTML
from pluto.types import MARKDOWN, PLAIN, Dialect

# the renderer's own dialects and the three the chat providers bring
DIALECTS = (PLAIN, MARKDOWN, TELEGRAM_HTML, SLACK_MRKDWN, DISCORD)

TELEGRAM_TAGS = {"b", "strong", "i", "em", "u", "s", "code", "pre", "a", "blockquote", "tg-spoiler"}


# --- helpers -------------------------------------------------------------------------------------

class _TelegramChecker(HTMLParser):
    """Parses a Telegram HTML chunk; fails on unknown tags, bad attributes or unbalanced tags."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        assert tag in TELEGRAM_TAGS, f"tag <{tag}> is not allowed"
        for name, _ in attrs:
            assert (tag, name) in {("a", "href"), ("code", "class")}, f"attribute {name} on <{tag}>"
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def telegram_text(chunk: str) -> str:
    """The visible text of a Telegram chunk, checking its tags and entities on the way."""
    assert not re.search(r"&(?!(amp|lt|gt|quot);)", chunk), f"bare & in {chunk!r}"
    checker = _TelegramChecker()
    checker.feed(chunk)
    checker.close()
    assert not checker.stack, f"unclosed {checker.stack} in {chunk!r}"
    return "".join(checker.text)


def slack_text(chunk: str) -> str:
    assert not re.search(r"&(?!(amp|lt|gt);)", chunk), f"bare & in {chunk!r}"
    text = re.sub(r"<[^|>]*\|([^>]*)>", r"\1", chunk)
    text = re.sub(r"^> ?", "", text, flags=re.MULTILINE)  # quote marks
    assert "<" not in text and ">" not in text, f"unescaped < or > in {chunk!r}"
    return unescape(re.sub(r"[*_~`]", "", text))


def visible_text(chunk: str, dialect: Dialect) -> str:
    if dialect == TELEGRAM_HTML:
        return telegram_text(chunk)
    if dialect == SLACK_MRKDWN:
        return slack_text(chunk)
    if dialect in (MARKDOWN, DISCORD):
        return render(chunk, PLAIN)  # read back through the parser: escapes must hold
    return chunk


def dialect_id(value: object) -> str | None:
    """Test ids name a dialect by its name."""
    return value.name if isinstance(value, Dialect) else None


def assert_in_order(words: list[str], chunks: list[str], dialect: Dialect) -> None:
    joined = re.sub(r"\s+", "", "".join(visible_text(chunk, dialect) for chunk in chunks))
    pos = 0
    for word in words:
        found = joined.find(word, pos)
        assert found >= 0, f"{word!r} lost (after offset {pos}) in {chunks!r}"
        pos = found + len(word)


# --- each construct in each dialect --------------------------------------------------------------

INLINE = "**b** *i* _j_ ~~s~~ `c` [t](https://x.io/a?b=1&c=2)"
CASES = {
    (PLAIN, INLINE): "b i j s c t (https://x.io/a?b=1&c=2)",
    (MARKDOWN, INLINE): "**b** *i* *j* ~~s~~ `c` [t](https://x.io/a?b=1&c=2)",
    (DISCORD, INLINE): "**b** *i* *j* ~~s~~ `c` [t](https://x.io/a?b=1&c=2)",
    (TELEGRAM_HTML, INLINE):
        '<b>b</b> <i>i</i> <i>j</i> <s>s</s> <code>c</code> <a href="https://x.io/a?b=1&amp;c=2">t</a>',
    (SLACK_MRKDWN, INLINE): "*b* _i_ _j_ ~s~ `c` <https://x.io/a?b=1&amp;c=2|t>",
    (PLAIN, "# Head\n\n#### Four"): "Head\n\nFour",
    (MARKDOWN, "# Head\n\n#### Four"): "# Head\n\n#### Four",
    (DISCORD, "# Head\n\n#### Four"): "# Head\n\n**Four**",
    (TELEGRAM_HTML, "# Head *x*\n\ntext"): "<b>Head <i>x</i></b>\n\ntext",
    (SLACK_MRKDWN, "## Head *x*\n\ntext"): "*Head x*\n\ntext",
    (TELEGRAM_HTML, "- a\n- b\n  1. c\n  2. d\n- e"): "• a\n• b\n  1. c\n  2. d\n• e",
    (SLACK_MRKDWN, "3. a\n4. b"): "3. a\n4. b",
    (MARKDOWN, "* a\n* b\n  + c"): "- a\n- b\n  - c",
    (PLAIN, "- a\n- b"): "- a\n- b",
    (TELEGRAM_HTML, "> quote **b**\n> line"): "<blockquote>quote <b>b</b>\nline</blockquote>",
    (SLACK_MRKDWN, "> quote **b**\n> line"): "> quote *b*\n> line",
    (DISCORD, "> a\n>\n> b"): "> a\n>\n> b",
    (TELEGRAM_HTML, "```python\nif a < b:\n    pass\n```"):
        '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>',
    (TELEGRAM_HTML, "```\nx\n```"): "<pre>x</pre>",
    (SLACK_MRKDWN, "```python\nif a < b: pass\n```"): "```\nif a &lt; b: pass\n```",
    (DISCORD, "```python\nx = 1\n```"): "```python\nx = 1\n```",
    (MARKDOWN, "````\n```\n````"): "````\n```\n````",
    (PLAIN, "```python\nx = 1\n```"): "x = 1",
    (TELEGRAM_HTML, "a\n\n---\n\nb"): "a\n\n──────────\n\nb",
    (MARKDOWN, "a\n\n***\n\nb"): "a\n\n---\n\nb",
    (TELEGRAM_HTML, "see <https://x.io>"): "see https://x.io",
    (MARKDOWN, "see <https://x.io>"): "see <https://x.io>",
    (MARKDOWN, "use `` a`b ``"): "use ``a`b``",
    (MARKDOWN, "use `` `tick ``"): "use `` `tick ``",
}


@pytest.mark.parametrize(("dialect", "markdown"), list(CASES), ids=dialect_id)
def test_each_construct(dialect: Dialect, markdown: str) -> None:
    assert render(markdown, dialect) == CASES[(dialect, markdown)]


TABLE = "| Name | Qty |\n|:-----|----:|\n| apple | 3 |\n| kiwi fruit | 12 |"
ALIGNED = "Name       | Qty\n-----------+----\napple      |   3\nkiwi fruit |  12"


@pytest.mark.parametrize(("dialect", "expected"), [
    (PLAIN, ALIGNED),
    (TELEGRAM_HTML, f"<pre>{ALIGNED}</pre>"),
    (SLACK_MRKDWN, f"```\n{ALIGNED}\n```"),
    (DISCORD, f"```\n{ALIGNED}\n```"),
    (MARKDOWN, "| Name       | Qty |\n| ---------- | --: |\n"
               "| apple      |   3 |\n| kiwi fruit |  12 |"),
], ids=dialect_id)
def test_table_is_aligned(dialect: Dialect, expected: str) -> None:
    assert render(TABLE, dialect) == expected


def test_table_counts_wide_characters_as_two_columns() -> None:
    lines = render("| a | b |\n|---|---|\n| 日本 | x |", PLAIN).split("\n")
    assert lines[0] == "a    | b"
    assert lines[2] == "日本 | x"


def test_markdown_escapes_only_what_would_be_syntax() -> None:
    source = r"2 * 3, snake_case, \*not bold\*, \# not a heading, see https://x.io/_a_/b."
    assert render(source, MARKDOWN) == \
        r"2 * 3, snake_case, \*not bold\*, # not a heading, see <https://x.io/_a_/b>."
    assert render("see https://x.io/_a_/b (https://w.org/F_(b))", DISCORD) == \
        "see https://x.io/_a_/b (https://w.org/F_(b))"
    assert render(r"\# title", MARKDOWN) == r"\# title"
    assert render(r"1\. not a list", MARKDOWN) == r"1\. not a list"
    assert render(r"spoiler \|\|x\|\|", DISCORD) == r"spoiler \|\|x\|\|"


# --- escaping ------------------------------------------------------------------------------------

HOSTILE = "<script>alert(1)</script> and a < b && c > d"


def test_telegram_escapes_text_and_only_emits_allowed_tags() -> None:
    out = render(HOSTILE + "\n\n**<b>x</b>** `<i>`", TELEGRAM_HTML)
    assert out == ("&lt;script&gt;alert(1)&lt;/script&gt; and a &lt; b &amp;&amp; c &gt; d\n\n"
                   "<b>&lt;b&gt;x&lt;/b&gt;</b> <code>&lt;i&gt;</code>")
    assert "script" in telegram_text(out)


def test_telegram_link_attribute_is_escaped() -> None:
    out = render('[x](https://e.com/?q="a"&b=<c>)', TELEGRAM_HTML)
    telegram_text(out)
    assert 'href="https://e.com/?q=%22a%22&amp;b=%3Cc%3E"' in out


def test_telegram_never_puts_code_inside_bold() -> None:
    assert render("**see `x`**", TELEGRAM_HTML) == "<b>see x</b>"


def test_slack_escapes_control_characters() -> None:
    assert render(HOSTILE, SLACK_MRKDWN) == \
        "&lt;script&gt;alert(1)&lt;/script&gt; and a &lt; b &amp;&amp; c &gt; d"


def test_unsafe_link_schemes_are_not_links() -> None:
    out = render("[click](javascript:alert(1))", TELEGRAM_HTML)
    assert "<a" not in out and "javascript" in out


# --- splitting -----------------------------------------------------------------------------------

def test_short_reply_is_one_chunk_and_blank_is_none() -> None:
    assert render_chunks("Hello **there**", TELEGRAM_HTML, 4096) == ["Hello <b>there</b>"]
    assert render_chunks("", DISCORD, 2000) == []
    assert render_chunks("  \n\t ", DISCORD, 2000) == []


def test_splits_at_paragraphs_first() -> None:
    paragraphs = [f"Paragraph {n} " + "word " * 12 for n in range(6)]
    chunks = render_chunks("\n\n".join(paragraphs), PLAIN, 200)
    assert chunks == ["\n\n".join(p.strip() for p in paragraphs[i:i + 2]) for i in (0, 2, 4)]


def test_splits_at_lines_then_sentences_then_words() -> None:
    lines = "\n".join(f"line {n} " + "x" * 30 for n in range(10))
    chunks = render_chunks(lines, PLAIN, 100)
    assert all(chunk.startswith("line ") and chunk.endswith("x" * 30) for chunk in chunks)
    sentences = " ".join(f"Sentence {n} has a few words." for n in range(12))
    chunks = render_chunks(sentences, PLAIN, 100)
    assert all(chunk.startswith("Sentence") and chunk.endswith(".") for chunk in chunks)
    words = " ".join(f"w{n}" for n in range(100))
    assert all(re.fullmatch(r"(w\d+ )*w\d+", chunk) for chunk in render_chunks(words, PLAIN, 64))
    assert render_chunks("y" * 150, PLAIN, 64) == ["y" * 64, "y" * 64, "y" * 22]


def test_bold_span_is_closed_and_reopened_across_chunks() -> None:
    chunks = render_chunks("**" + " ".join(["bold"] * 40) + "**", TELEGRAM_HTML, 64)
    assert len(chunks) > 2
    assert all(c.startswith("<b>bold") and c.endswith("bold</b>") for c in chunks)
    chunks = render_chunks("**" + " ".join(["bold"] * 40) + "**", DISCORD, 64)
    assert all(c.startswith("**bold") and c.endswith("bold**") for c in chunks)


CODE_LINES = [f"value_{n} = compute({n})  # step {n}" for n in range(20)]
CODE = "```python\n" + "\n".join(CODE_LINES) + "\n```"


@pytest.mark.parametrize(("dialect", "opener", "closer"), [
    (TELEGRAM_HTML, '<pre><code class="language-python">', "</code></pre>"),
    (MARKDOWN, "```python\n", "\n```"),
    (DISCORD, "```python\n", "\n```"),
    (SLACK_MRKDWN, "```\n", "\n```"),
], ids=dialect_id)
def test_long_code_block_is_closed_and_reopened(dialect: Dialect, opener: str,
                                                closer: str) -> None:
    chunks = render_chunks("Here:\n\n" + CODE, dialect, 300)
    code_chunks = [c[c.index(opener):] for c in chunks if opener in c]
    assert len(code_chunks) == len(chunks) >= 3
    for chunk in code_chunks:
        assert len(chunk) <= 300 and chunk.endswith(closer)
        lines = chunk.removeprefix(opener).removesuffix(closer).split("\n")
        assert all(re.fullmatch(r"value_(\d+) = compute\(\1\)  # step \1", ln) for ln in lines)
    assert_in_order([f"step{n}" for n in range(20)], chunks, dialect)


def test_code_indentation_survives_a_split() -> None:
    code = "```py\n" + "\n".join("    " + "x" * 20 for _ in range(10)) + "\n```"
    for chunk in render_chunks(code, DISCORD, 100):
        body = chunk.removeprefix("```py\n").removesuffix("\n```")
        assert all(line == "    " + "x" * 20 for line in body.split("\n"))


def test_never_cuts_an_entity_or_a_tag() -> None:
    text = "&" * 300
    for limit in range(64, 90):
        for chunk in render_chunks(text, TELEGRAM_HTML, limit):
            assert len(chunk) <= limit and re.fullmatch(r"(&amp;)+", chunk)


def test_link_too_long_for_a_chunk_keeps_its_url_as_text() -> None:
    url = "https://example.com/" + "p" * 200
    chunks = render_chunks(f"see [the docs]({url}) now", TELEGRAM_HTML, 100)
    assert all(len(chunk) <= 100 for chunk in chunks)
    assert "<a " not in "".join(chunks)
    assert_in_order(["see", "the", "docs", "https://example.com/", "now"], chunks, TELEGRAM_HTML)


def test_table_split_keeps_rows_whole() -> None:
    rows = "\n".join(f"| item {n} | {n * 10} |" for n in range(30))
    chunks = render_chunks(f"| Item | Value |\n|---|--:|\n{rows}", TELEGRAM_HTML, 200)
    assert len(chunks) > 2
    for chunk in chunks:
        assert chunk.startswith("<pre>") and chunk.endswith("</pre>") and len(chunk) <= 200
        body = chunk.removeprefix("<pre>").removesuffix("</pre>")
        assert all(len(line) == len(body.split("\n")[0]) for line in body.split("\n"))


def test_rendering_failure_falls_back_to_plain_text(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    def broken(markdown: str, dialect: Dialect) -> list[object]:
        raise RuntimeError("boom")

    monkeypatch.setattr(render_pkg, "_tokens", broken)
    with caplog.at_level(logging.WARNING, logger="pluto.gateway.delivery.render"):
        chunks = render_chunks("**a** < b " * 20, TELEGRAM_HTML, 64)
    assert chunks and all(len(c) <= 64 and "<" not in c for c in chunks)
    assert "&lt;" in chunks[0]
    assert any("plain text" in record.message for record in caplog.records)


def test_unknown_dialect() -> None:
    with pytest.raises(ValueError, match="unknown markup dialect"):
        render("x", Dialect("html"))
    assert render_chunks("**x**", Dialect("html"), 100) == ["**x**"]
    assert render_preview("**x**", Dialect("html"), 100) == "**x**"


def test_a_provider_brings_its_own_emitter() -> None:
    """A dialect the renderer does not know by name renders with the emitter it brings, and
    its name does not matter: the emitter does."""
    assert render("**x** <y>", Dialect("anything", TELEGRAM_HTML.emitter)) == "<b>x</b> &lt;y&gt;"
    assert render("**x**", Dialect("markdown", TELEGRAM_HTML.emitter)) == "<b>x</b>"
    with pytest.raises(TypeError, match="not a subclass of Emitter"):
        render("x", Dialect("bad", str))


@pytest.mark.parametrize(("dialect", "escaped"), [
    (PLAIN, "**a** < b_c"),
    (MARKDOWN, r"\*\*a\*\* < b_c"),
    (DISCORD, r"\*\*a\*\* < b_c"),
    (TELEGRAM_HTML, "**a** &lt; b_c"),
    (SLACK_MRKDWN, "**a** &lt; b_c"),
], ids=dialect_id)
def test_the_fallback_escapes_with_the_dialects_emitter(monkeypatch: pytest.MonkeyPatch,
                                                        dialect: Dialect, escaped: str) -> None:
    def broken(markdown: str, dialect: Dialect) -> list[object]:
        raise RuntimeError("boom")

    monkeypatch.setattr(render_pkg, "_tokens", broken)
    assert render_chunks("**a** < b_c", dialect, 100) == [escaped]
    assert render_preview("**a** < b_c", dialect, 100) == escaped


# --- previews of a streaming reply ---------------------------------------------------------------

def test_preview_closes_what_is_open() -> None:
    assert render_preview("Some **bold text still stre", TELEGRAM_HTML, 100) == \
        "Some <b>bold text still stre</b>"
    assert render_preview("Run:\n```py\nx = 1\ny =", DISCORD, 100) == \
        "Run:\n\n```py\nx = 1\ny =\n```"
    assert render_preview("call `foo(", MARKDOWN, 100) == "call `foo(`"
    assert render_preview("**see `foo(", TELEGRAM_HTML, 100) == "<b>see foo(</b>"
    assert render_preview("it is **", SLACK_MRKDWN, 100) == "it is"
    assert render_preview("", PLAIN, 100) == ""


def test_preview_is_truncated_with_an_ellipsis() -> None:
    text = "```python\n" + "\n".join(f"line_{n} = {n}" for n in range(500))
    out = render_preview(text, TELEGRAM_HTML, 120)
    assert len(out) <= 120 and out.endswith("</code></pre>…")
    telegram_text(out.removesuffix("…"))
    out = render_preview(text, MARKDOWN, 120)
    assert len(out) <= 120 and out.endswith("```\n…")


# --- properties ----------------------------------------------------------------------------------

WORD = st.text("abcdefghij", min_size=1, max_size=8)
LONG_WORD = st.text("klmnop", min_size=70, max_size=150)
NOISE = st.sampled_from(["<", ">", "&", "a<b", "x_y", "*", "2 * 3", "&amp;", "\\", "|", "~"])


@st.composite
def inline(draw: st.DrawFn, words: list[str]) -> str:
    kind = draw(st.integers(0, 9))
    word = draw(LONG_WORD if kind == 9 else WORD)
    words.append(word)
    if kind in (7, 8):
        more = draw(WORD)
        words.append(more)
        if kind == 7:
            return f"[{word} {more}](https://example.com/{draw(WORD)}?q=1&r=2)"
        return f"**{word} *{more}***"
    return (word, f"**{word}**", f"*{word}*", f"~~{word}~~", f"`{word}`",
            f"{draw(NOISE)} {word}", f"{word}.", word, word, word)[kind]


@st.composite
def paragraph(draw: st.DrawFn, words: list[str]) -> str:
    return " ".join(draw(inline(words)) for _ in range(draw(st.integers(1, 12))))


@st.composite
def block(draw: st.DrawFn, words: list[str]) -> str:
    kind = draw(st.integers(0, 7))
    if kind == 1:
        return "#" * draw(st.integers(1, 6)) + " " + draw(paragraph(words))
    if kind == 2:
        items = [draw(paragraph(words)) for _ in range(draw(st.integers(1, 4)))]
        return "\n".join(f"{'  ' * (i % 2)}- {item}" for i, item in enumerate(items))
    if kind == 3:
        lines = [" ".join(draw(st.lists(WORD, min_size=1, max_size=10))) for _ in range(3)]
        words.extend(w for line in lines for w in line.split())
        return "```python\n" + "\n".join("    " + line for line in lines) + "\n```"
    if kind == 4:
        return "> " + draw(paragraph(words))
    if kind == 5:
        cells = [[draw(WORD) for _ in range(3)] for _ in range(draw(st.integers(1, 4)))]
        words.extend(w for row in cells for w in row)
        head, *body = ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join([head, "|---|:-:|--:|", *body])
    if kind == 6:
        return "1. " + draw(paragraph(words)) + "\n2. " + draw(paragraph(words))
    return draw(paragraph(words))


@st.composite
def document(draw: st.DrawFn) -> tuple[str, list[str]]:
    words: list[str] = []
    blocks = [draw(block(words)) for _ in range(draw(st.integers(1, 6)))]
    return "\n\n".join(blocks), words


PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, database=None,
                             suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(doc=document(), dialect=st.sampled_from(DIALECTS), limit=st.integers(64, 400))
def test_chunks_fit_are_valid_and_lose_no_text(doc: tuple[str, list[str]], dialect: Dialect,
                                               limit: int) -> None:
    markdown, words = doc
    chunks = render_chunks(markdown, dialect, limit)
    assert chunks
    for chunk in chunks:
        assert chunk.strip() and len(chunk) <= limit
        if dialect in (MARKDOWN, DISCORD, SLACK_MRKDWN):
            assert sum(line.startswith("```") for line in chunk.split("\n")) % 2 == 0, chunk
    assert_in_order(words, chunks, dialect)


@PROPERTY_SETTINGS
@given(text=st.text(st.characters(codec="utf-8"), max_size=600)
       | st.text("*_`~#>-|[]()<&\n !x1.", max_size=600),
       dialect=st.sampled_from(DIALECTS), limit=st.integers(64, 300))
def test_any_text_never_raises(text: str, dialect: Dialect, limit: int) -> None:
    chunks = render_chunks(text, dialect, limit)
    assert all(chunk.strip() and len(chunk) <= limit for chunk in chunks)
    if dialect == TELEGRAM_HTML:
        for chunk in chunks:
            telegram_text(chunk)
    preview = render_preview(text, dialect, limit)
    assert len(preview) <= limit
