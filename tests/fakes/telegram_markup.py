"""Text rules of the fake Telegram Bot API: parse_mode=HTML / MarkdownV2, trimming, auto-entities.

The parsers follow tdlib's ``parse_html`` / ``parse_markdown_v2`` (the code behind the Bot API), so
error texts and byte offsets match what api.telegram.org answers, e.g.
``Bad Request: can't parse entities: Unsupported start tag "p" at byte offset 0``.
"""

from __future__ import annotations

import re

from .telegram_state import ApiError, bad


# ---------------------------------------------------------------- text helpers
def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _u16_of_byte(c: int) -> int:
    """UTF-16 units contributed by a UTF-8 byte (counted on the first byte of a character)."""
    if c & 0xC0 == 0x80:
        return 0
    return 2 if c >= 0xF0 else 1


def _is_space(c: int) -> bool:          # tdlib's is_space (NUL counts, which ends every scan)
    return c in (0x20, 0x09, 0x0D, 0x0A, 0x00, 0x0B)


def _checked_link(url: str) -> str:
    """A loose LinkManager::get_checked_link: '' when Telegram would drop the link."""
    url = url.strip()
    if re.match(r"^(https?|tg|ton)://\S+$", url, re.I):
        return url
    if re.match(r"^[\w.-]+\.[a-z]{2,}(/\S*)?$", url, re.I):
        return "http://" + url + ("" if "/" in url else "/")
    return ""


def _link_entity(offset: int, length: int, url: str) -> dict | None:
    m = re.match(r"^tg://user\?id=(\d+)$", url)
    if m:
        user = {"id": int(m.group(1)), "is_bot": False, "first_name": ""}
        return {"type": "text_mention", "offset": offset, "length": length, "user": user}
    url = _checked_link(url)
    return {"type": "text_link", "offset": offset, "length": length, "url": url} if url else None


def _decode_html_entity(b: bytes, pos: int) -> tuple[int, int]:
    """(code point, position after the entity), or (0, pos) when it is not an entity."""
    at = lambda k: b[k] if k < len(b) else 0  # noqa: E731
    end, res = pos + 1, 0
    if at(end) == ord("#"):
        end += 1
        if at(end) == ord("x"):
            end += 1
            while chr(at(end)) in "0123456789abcdefABCDEF" and at(end):
                res = res * 16 + int(chr(b[end]), 16)
                end += 1
        else:
            while 0x30 <= at(end) <= 0x39:
                res = res * 10 + b[end] - 0x30
                end += 1
        if res == 0 or res >= 0x10FFFF or end - pos >= 10:
            return 0, pos
    else:
        while chr(at(end)).isascii() and chr(at(end)).isalpha():
            end += 1
        res = {b"lt": 0x3C, b"gt": 0x3E, b"amp": 0x26, b"quot": 0x22}.get(b[pos + 1:end], 0)
        if not res:
            return 0, pos
    return res, end + 1 if at(end) == ord(";") else end


_HTML_TAGS = {"a", "b", "strong", "i", "em", "s", "strike", "del", "u", "ins", "tg-spoiler", "tg-emoji",
              "span", "pre", "code", "blockquote"}
_SIMPLE = {"b": "bold", "strong": "bold", "i": "italic", "em": "italic", "s": "strikethrough",
           "strike": "strikethrough", "del": "strikethrough", "u": "underline", "ins": "underline",
           "tg-spoiler": "spoiler"}


def parse_html(text: str) -> tuple[str, list[dict]]:
    """Bot API parse_mode=HTML: (plain text, entities) or ApiError 400 "can't parse entities: ..."."""
    b = text.encode("utf-8")
    at = lambda k: b[k] if k < len(b) else 0  # noqa: E731
    out = bytearray()
    entities: list[dict] = []
    stack: list[tuple[str, str, int, int]] = []     # tag, argument, utf16 offset, out byte offset
    u16 = 0

    def fail(msg: str) -> ApiError:
        return bad("can't parse entities: " + msg)

    i = 0
    while i < len(b):
        c = b[i]
        if c == ord("&"):
            code, end = _decode_html_entity(b, i)
            if code:
                u16 += 2 if code > 0xFFFF else 1
                out += chr(code).encode("utf-8", "surrogatepass")
                i = end
                continue
        if c != ord("<"):
            u16 += _u16_of_byte(c)
            out.append(c)
            i += 1
            continue
        begin = i
        i += 1
        if at(i) != ord("/"):
            while not _is_space(at(i)) and at(i) != ord(">"):
                i += 1
            if at(i) == 0:
                raise fail(f"Unclosed start tag at byte offset {begin}")
            tag = b[begin + 1:i].decode("utf-8", "replace").lower()
            if tag not in _HTML_TAGS:
                raise fail(f'Unsupported start tag "{tag}" at byte offset {begin}')
            argument = ""
            while at(i) != ord(">"):
                while at(i) and _is_space(at(i)):
                    i += 1
                if at(i) == ord(">"):
                    break
                name_begin = i
                while not _is_space(at(i)) and at(i) not in (ord("="), ord(">")):
                    i += 1
                name = b[name_begin:i].decode("utf-8", "replace")
                if not name:
                    raise fail(f'Empty attribute name in the tag "{tag}" at byte offset {begin}')
                while at(i) and _is_space(at(i)):
                    i += 1
                if tag == "blockquote" and name == "expandable" and at(i) != ord("="):
                    argument = "expandable"
                    continue
                if at(i) != ord("="):
                    raise fail(f'Expected equal sign in declaration of an attribute of the tag "{tag}" '
                               f"at byte offset {begin}")
                i += 1
                while at(i) and _is_space(at(i)):
                    i += 1
                if at(i) == 0:
                    raise fail(f'Unclosed start tag "{tag}" at byte offset {begin}')
                if at(i) not in (ord("'"), ord('"')):
                    token_begin = i
                    while chr(at(i)).isascii() and (chr(at(i)).isalnum() or at(i) in b".-") and at(i):
                        i += 1
                    value = b[token_begin:i].decode().lower()
                    if not _is_space(at(i)) and at(i) != ord(">"):
                        raise fail(f"Unexpected end of name token at byte offset {token_begin}")
                else:
                    quote = at(i)
                    i += 1
                    vb = bytearray()
                    while at(i) != quote and at(i):
                        if at(i) == ord("&"):
                            code, end = _decode_html_entity(b, i)
                            if code:
                                vb += chr(code).encode("utf-8", "surrogatepass")
                                i = end
                                continue
                        vb.append(b[i])
                        i += 1
                    if at(i) == quote:
                        i += 1
                    value = vb.decode("utf-8", "replace")
                if at(i) == 0:
                    raise fail(f"Unclosed start tag at byte offset {begin}")
                if tag == "a" and name == "href":
                    argument = value
                elif tag == "code" and name == "class" and value.startswith("language-"):
                    argument = value[9:]
                elif tag == "span" and name == "class" and value.startswith("tg-"):
                    argument = value[3:]
                elif tag == "tg-emoji" and name == "emoji-id":
                    argument = value
            if tag == "span" and argument != "spoiler":
                raise fail(f'Tag "span" must have class "tg-spoiler" at byte offset {begin}')
            stack.append((tag, argument, u16, len(out)))
            i += 1                                  # skip '>'
            continue
        # end tag
        if not stack:
            raise fail(f"Unexpected end tag at byte offset {begin}")
        while not _is_space(at(i)) and at(i) != ord(">"):
            i += 1
        end_tag = b[begin + 2:i].decode("utf-8", "replace").lower()
        while _is_space(at(i)) and at(i):
            i += 1
        if at(i) != ord(">"):
            raise fail(f"Unclosed end tag at byte offset {begin}")
        i += 1
        tag, argument, offset, out_begin = stack.pop()
        if end_tag and end_tag != tag:
            raise fail(f'Unmatched end tag at byte offset {begin}, expected "</{tag}>", found "</{end_tag}>"')
        length = u16 - offset
        if length <= 0:
            continue
        last = entities[-1] if entities else None
        same_span = last is not None and last["offset"] == offset and last["length"] == length
        if tag in _SIMPLE or (tag == "span"):
            entities.append({"type": _SIMPLE.get(tag, "spoiler"), "offset": offset, "length": length})
        elif tag == "tg-emoji":
            if not argument.isdigit() or int(argument) == 0:
                raise bad("Invalid custom emoji identifier specified")
            entities.append({"type": "custom_emoji", "offset": offset, "length": length,
                             "custom_emoji_id": argument})
        elif tag == "a":
            url = argument or bytes(out[out_begin:]).decode("utf-8", "replace")
            ent = _link_entity(offset, length, url)
            if ent:
                entities.append(ent)
        elif tag == "pre":
            if same_span and last["type"] == "code" and last.get("language"):
                last["type"] = "pre"
            else:
                entities.append({"type": "pre", "offset": offset, "length": length})
        elif tag == "code":
            if same_span and last["type"] == "pre" and argument:
                last["language"] = argument
            else:
                entities.append({"type": "code", "offset": offset, "length": length, "language": argument})
        else:  # blockquote
            kind = "expandable_blockquote" if argument == "expandable" else "blockquote"
            entities.append({"type": kind, "offset": offset, "length": length})
    if stack:
        raise fail(f"Can't find end tag corresponding to start tag {stack[-1][0]}")
    for ent in entities:
        if ent["type"] == "code" or not ent.get("language"):
            ent.pop("language", None)
    try:
        plain = bytes(out).decode("utf-8")
    except UnicodeDecodeError:
        raise bad("Text contains invalid Unicode characters after decoding HTML entities, "
                  "check for unmatched surrogate code units")
    return plain, sorted(entities, key=lambda e: (e["offset"], -e["length"]))


_MD_NAMES = {"bold": "Bold", "italic": "Italic", "underline": "Underline", "strikethrough": "Strikethrough",
             "spoiler": "Spoiler", "code": "Code", "pre": "Pre", "precode": "PreCode", "text_link": "TextUrl",
             "blockquote": "BlockQuote"}


def parse_markdown_v2(text: str) -> tuple[str, list[dict]]:
    """Bot API parse_mode=MarkdownV2 (tdlib's rules, without custom emoji)."""
    b = text.encode("utf-8")
    at = lambda k: b[k] if k < len(b) else 0  # noqa: E731
    out = bytearray()
    entities: list[dict] = []
    stack: list[list] = []           # [kind, argument, utf16 offset, byte offset in input, out offset]
    u16, quote, i = 0, False, 0

    def reserved(ch: int) -> ApiError:
        return bad(f"can't parse entities: Character '{chr(ch)}' is reserved and must be escaped "
                   "with the preceding '\\'")

    def unclosed(entry: list) -> ApiError:
        return bad(f"can't parse entities: Can't find end of {_MD_NAMES[entry[0]]} entity "
                   f"at byte offset {entry[3]}")

    while i < len(b):
        c = b[i]
        if c == ord("\\") and 0 < at(i + 1) <= 126:
            out.append(b[i + 1])
            u16, i = u16 + 1, i + 2
            continue
        specials = b"`" if stack and stack[-1][0] in ("code", "pre", "precode") else b"_*[]()~`>#+-=|{}.!\n"
        if c not in specials:
            u16 += _u16_of_byte(c)
            out.append(c)
            i += 1
            continue
        top = stack[-1][0] if stack else None
        closes = top is not None and (
            (quote and c == 0x0A and at(i + 1) != ord(">"))
            or (top == "bold" and c == ord("*"))
            or (top == "italic" and c == ord("_") and at(i + 1) != ord("_"))
            or (top == "code" and c == ord("`"))
            or (top in ("pre", "precode") and b[i:i + 3] == b"```")
            or (top == "text_link" and c == ord("]"))
            or (top == "underline" and b[i:i + 2] == b"__")
            or (top == "strikethrough" and c == ord("~"))
            or (top == "spoiler" and b[i:i + 2] == b"||"))
        if not closes:
            start, argument = i, ""
            if c == ord("_"):
                kind = "underline" if at(i + 1) == ord("_") else "italic"
                i += kind == "underline"
            elif c in b"*~":
                kind = "bold" if c == ord("*") else "strikethrough"
            elif c == ord("|") and at(i + 1) == ord("|"):
                kind, i = "spoiler", i + 1
            elif c == ord("["):
                kind = "text_link"
            elif c == ord("`") and b[i:i + 3] == b"```":
                i += 3
                kind, lang_end = "pre", i
                while not _is_space(at(lang_end)) and at(lang_end) != ord("`"):
                    lang_end += 1
                if i != lang_end and lang_end < len(b) and at(lang_end) != ord("`"):
                    kind, argument, i = "precode", b[i:lang_end].decode(), lang_end
                if at(i) in b"\r\n" and at(i):
                    i += 2 if at(i + 1) in b"\r\n" and at(i + 1) and at(i) != at(i + 1) else 1
                i -= 1
            elif c == ord("`"):
                kind = "code"
            elif c == 0x0A:
                out.append(c)
                u16 += 1
                if at(i + 1) == ord(">"):
                    i += 1
                    if not quote:
                        quote = True
                        stack.append(["blockquote", "", u16, start, len(out)])
                i += 1
                continue
            elif c == ord(">") and i == 0:
                kind, quote = "blockquote", True
            else:
                raise reserved(c)
            stack.append([kind, argument, u16, start, len(out)])
            i += 1
            continue
        entry = stack[-1]
        kind, argument, offset = entry[0], entry[1], entry[2]
        if c == 0x0A and kind != "blockquote":
            raise unclosed(entry)
        skip = u16 == offset
        if kind in ("underline", "spoiler"):
            i += 1
        elif kind in ("pre", "precode"):
            i += 2
        elif kind == "text_link":
            if at(i + 1) != ord("("):
                url = bytes(out[entry[4]:]).decode("utf-8", "replace")
            else:
                i += 2
                url_begin, ub = i, bytearray()
                while i < len(b) and b[i] != ord(")"):
                    if b[i] == ord("\\") and 0 < at(i + 1) <= 126:
                        ub.append(b[i + 1])
                        i += 2
                        continue
                    ub.append(b[i])
                    i += 1
                if at(i) != ord(")"):
                    raise bad(f"can't parse entities: Can't find end of a URL at byte offset {url_begin}")
                url = ub.decode("utf-8", "replace")
            link = _link_entity(offset, u16 - offset, url)
            skip = skip or link is None
        elif kind == "blockquote":
            quote = False
            out.append(c)
            u16 += 1
        if not skip:
            if kind == "text_link":
                entities.append(link)
            else:
                ent = {"type": "pre" if kind == "precode" else kind, "offset": offset, "length": u16 - offset}
                if kind == "precode":
                    ent["language"] = argument
                entities.append(ent)
        stack.pop()
        i += 1
    if quote and stack and stack[-1][0] == "blockquote":
        entry = stack.pop()
        if u16 > entry[2]:
            entities.append({"type": "blockquote", "offset": entry[2], "length": u16 - entry[2]})
    if stack:
        raise unclosed(stack[-1])
    return bytes(out).decode("utf-8"), sorted(entities, key=lambda e: (e["offset"], -e["length"]))


def parse_text(text: str | None, parse_mode: str | None, entities: list | None) -> tuple[str, list[dict]]:
    """Apply parse_mode (or explicit entities), then trim whitespace as Telegram does."""
    text = text or ""
    mode = (parse_mode or "").lower()
    if mode == "html":
        text, ents = parse_html(text)
    elif mode == "markdownv2":
        text, ents = parse_markdown_v2(text)
    elif mode in ("", "none"):
        ents = [dict(e) for e in entities or []]
    elif mode == "markdown":
        ents = []          # legacy mode: accepted, not interpreted
    else:
        raise bad("unsupported parse_mode")
    return trim(text, ents)


def trim(text: str, entities: list[dict]) -> tuple[str, list[dict]]:
    stripped = text.lstrip()
    lead = utf16_len(text) - utf16_len(stripped)
    stripped = stripped.rstrip()
    total = utf16_len(stripped)
    out = []
    for ent in entities:
        start = max(ent["offset"] - lead, 0)
        end = min(ent["offset"] + ent["length"] - lead, total)
        if end > start:
            out.append({**ent, "offset": start, "length": end - start})
    return stripped, out


_AUTO_ENTITIES = [
    ("bot_command", re.compile(r"(?<![\w/<>])/[A-Za-z0-9_]{1,64}(?:@[A-Za-z0-9_]{3,32})?(?![\w/<>])")),
    ("mention", re.compile(r"(?<!\w)@[A-Za-z0-9_]{5,32}(?!\w)")),
    ("hashtag", re.compile(r"(?<!\w)#\w*[^\W\d_]\w*")),
    ("url", re.compile(r"\bhttps?://[^\s<>\"]+")),
]


def detect_entities(text: str) -> list[dict]:
    """Entities Telegram's server adds to a user's message (commands, mentions, hashtags, URLs)."""
    found = []
    for kind, rx in _AUTO_ENTITIES:
        for m in rx.finditer(text):
            found.append({"type": kind, "offset": utf16_len(text[:m.start()]), "length": utf16_len(m.group())})
    return sorted(found, key=lambda e: e["offset"])
