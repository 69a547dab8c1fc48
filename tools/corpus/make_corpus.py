#!/usr/bin/env python3
"""Writes the tokenizer test corpus: tests/tokenizer/corpus.jsonl, one {"id","category","text"} a line.

Deterministic (fixed seed, standard library only), so the committed file can be regenerated and
diffed:  python3 tools/corpus/make_corpus.py [--out PATH] [--seed N]
Each category aims at a way a tokenizer can split differently from Hugging Face's: scripts and
regex classes, emoji sequences, normalisation, digits, whitespace, contractions, added tokens,
BPE on long words, and arbitrary code points. Prints the count per category.
"""
import argparse
import json
import random
import sys
import unicodedata

SENTENCES = {
    "english": ["The quick brown fox jumps over the lazy dog.", "It's a truth universally acknowledged.",
                "Routing replay keeps training and inference in step."],
    "french": ["Où est la bibliothèque ? Je l'ai cherchée partout.", "Ça coûte vingt-deux euros, s'il vous plaît."],
    "german": ["Größenwahnsinnige Straßenbahnfahrer überqueren Brücken.", "Die Überprüfung ergab: alles in Ordnung."],
    "spanish": ["¿Dónde está el niño? ¡Allí, junto al árbol!", "La cigüeña come piñones en España."],
    "portuguese": ["Não há nada como a saudade de um coração.", "Ações e informações já estão disponíveis."],
    "turkish": ["İstanbul'da ılık bir akşam; şiir ve çay.", "Işık ığdır, İĞNE ve iğne."],
    "polish": ["Zażółć gęślą jaźń, źdźbło trawy.", "Łódź i Kraków są w Polsce."],
    "russian": ["Съешь же ещё этих мягких французских булок, да выпей чаю.", "Привет, мир! Как дела?"],
    "greek": ["Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.", "Καλημέρα κόσμε· τι κάνεις;"],
    "arabic": ["مرحبا بالعالم، كيف حالك اليوم؟", "اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ ١٢٣٤٥"],
    "hebrew": ["שלום עולם, מה שלומך?", "עִבְרִית עם נִקּוּד מלא."],
    "hindi": ["नमस्ते दुनिया, आप कैसे हैं?", "हिन्दी में क्षत्रिय और ज्ञान लिखे जाते हैं। १२३"],
    "bengali": ["আমি বাংলায় গান গাই।", "কেমন আছেন? ধন্যবাদ।"],
    "tamil": ["வணக்கம் உலகம், நீங்கள் எப்படி இருக்கிறீர்கள்?", "தமிழ் மொழி மிகவும் பழமையானது."],
    "thai": ["สวัสดีชาวโลก คุณสบายดีไหม", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ"],
    "chinese": ["你好，世界！今天天气很好。", "混合专家模型的路由重放非常重要。", "繁體中文：學習機器翻譯。"],
    "japanese": ["こんにちは世界。カタカナとひらがなと漢字。", "東京都の天気は晴れです、ｶﾀｶﾅ半角も。"],
    "korean": ["안녕하세요 세계! 한국어 문장입니다.", "다람쥐 헌 쳇바퀴에 타고파."],
    "vietnamese": ["Tiếng Việt có nhiều dấu thanh: à á ả ã ạ.", "Xin chào thế giới, bạn khỏe không?"],
    "georgian": ["გამარჯობა მსოფლიო, როგორ ხარ?"],
    "armenian": ["Բարեւ աշխարհ, ինչպե՞ս ես։"],
    "amharic": ["ሰላም ለዓለም፣ እንዴት ነህ?"],
    "ukrainian": ["Ґанок, їжак, єнот і Ярослав."],
    "persian": ["سلام دنیا، حال شما چطور است؟ ۱۲۳۴"],
    "sinhala": ["ආයුබෝවන් ලෝකය"],
    "khmer": ["សួស្តី​ពិភពលោក"],
    "tibetan": ["བཀྲ་ཤིས་བདེ་ལེགས།"],
    "mongolian": ["ᠮᠣᠩᠭᠣᠯ ᠪᠢᠴᠢᠭ"],
    "cherokee": ["ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ"],
}

# (first, last) code point ranges of letters per script, for random word salads.
SCRIPT_LETTERS = {
    "latin": (0x61, 0x7A), "latin_ext": (0x100, 0x17F), "cyrillic": (0x430, 0x44F), "greek": (0x3B1, 0x3C9),
    "arabic": (0x627, 0x64A), "hebrew": (0x5D0, 0x5EA), "devanagari": (0x915, 0x939), "bengali": (0x995, 0x9B9),
    "tamil": (0xB95, 0xBB9), "thai": (0xE01, 0xE2E), "han": (0x4E00, 0x9FA5), "hiragana": (0x3041, 0x3096),
    "katakana": (0x30A1, 0x30FA), "hangul": (0xAC00, 0xD7A3), "georgian": (0x10D0, 0x10FA),
    "armenian": (0x561, 0x586), "ethiopic": (0x1200, 0x1248), "gujarati": (0xA95, 0xAB9), "telugu": (0xC15, 0xC39),
    "kannada": (0xC95, 0xCB9), "malayalam": (0xD15, 0xD39), "lao": (0xE81, 0xEA3), "myanmar": (0x1000, 0x102A),
}

EMOJI_BASE = ["😀", "😂", "🥲", "🤖", "🧠", "🚀", "🔥", "💯", "🎉", "❤️", "👍", "👋", "🙏", "🐍", "🦀", "🍕", "☕", "✨", "⭐", "🌍"]
SKIN_TONES = ["\U0001F3FB", "\U0001F3FC", "\U0001F3FD", "\U0001F3FE", "\U0001F3FF"]
TONEABLE = ["👍", "👋", "🙏", "👩", "👨", "🧑", "✋", "👏", "💪", "🤝"]
ZWJ_SEQUENCES = ["👩\u200d💻", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "🧑\u200d🚀", "👁️\u200d🗨️", "🐻\u200d❄️",
                 "❤️\u200d🔥", "👩🏽\u200d🔬", "🧑🏿\u200d🤝\u200d🧑🏻", "🏴\u200d☠️"]
FLAGS = ["US", "FR", "DE", "JP", "CN", "BR", "IN", "UA", "KR", "ZA", "GB", "EU", "UN"]
KEYCAPS = ["1\ufe0f\u20e3", "#\ufe0f\u20e3", "*\u20e3"]
SUBDIVISION_FLAG = "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F"  # Scotland

SPECIAL_PIECES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                  "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>",
                  "<|startoftext|>", "<|endofprompt|>", "<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>", "<pad>",
                  "<mask>", "<tool>", "[NL]", "Hello"]
PARTIAL_SPECIALS = ["<|im_start", "im_start|>", "<|im_", "<|endoftext", "|endoftext|>", "<|", "|>", "<think", "</think",
                    "<|start", "<|message", "<|channel|", "< |im_end|>", "<|IM_START|>", "<mask", "mask>", "<s", "</"]

CODE_SNIPPETS = [
    "def {f}(x, y=None):\n    \"\"\"Return the {w} of x.\"\"\"\n    if y is None:\n        return x * {n}\n    return x + y  # {w}\n",
    "for (int i = 0; i < {n}; ++i) {{\n\tsum += values[i] * {f}(i);\n}}\n",
    "const {f} = async (req, res) => {{\n  const {{ {w} }} = req.body;\n  res.json({{ ok: true, n: {n} }});\n}};\n",
    "#include <vector>\nstd::vector<int32_t> {f}(std::string_view s) {{ return {{{n}, {n}}}; }}\n",
    "SELECT {w}, COUNT(*) FROM t WHERE id > {n} GROUP BY {w} ORDER BY 2 DESC;\n",
    "{{\"{w}\": [{n}, {n}.5, -1e-9], \"{f}\": {{\"nested\": null, \"ok\": true}}}}\n",
    "if [[ -f \"$HOME/.{w}rc\" ]]; then\n  source ~/.{w}rc && echo \"loaded {n}\" >&2\nfi\n",
    "fn {f}(v: &[u8]) -> Result<usize, Error> {{\n    let n = v.iter().filter(|b| **b == b'\\n').count();\n    Ok(n + {n})\n}}\n",
    "<div class=\"{w}\" id=\"{f}\">&nbsp;{n}&lt;/div&gt;</div>\r\n",
    "    x_{n} = np.zeros(({n}, {n}), dtype=np.float32)\r\n    y = x_{n}.T @ x_{n}\r\n",
    "// TODO({w}): handle CRLF\r\n#define {F}_MAX {n}\r\n",
    "import {{ {f} }} from './{w}.js';\nexport default class {F} extends Base {{}}\n",
]
WORDS = ["alpha", "beta", "gamma", "router", "expert", "token", "replay", "cache", "value", "index", "stream",
         "parse", "merge", "encode", "decode", "Hello", "HELLO", "hello", "naïve", "café", "Zürich"]

WHITESPACE_CHARS = [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2000", "\u2003",
                    "\u200b", "\ufeff", "\u2028", "\u2029", "\u0085", "\u000b", "\u000c", " \n", "\n ", " \t ", "\u1680",
                    "\u202f", "\u205f"]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'rE", "'lL",
                "’s", "’T", "'", "''", "'x"]
CONTRACTION_WORDS = ["I", "you", "YOU", "it", "IT", "We", "they", "She", "don", "DON", "can", "won", "He", "that",
                     "There", "x", "Ünïcode", "Ǆ", "ǅ"]

# Blocks to draw random code points from: (name, first, last).
BLOCKS = [
    ("C0", 0x0, 0x1F), ("ASCII", 0x20, 0x7E), ("C1", 0x7F, 0x9F), ("Latin-1", 0xA0, 0xFF),
    ("Latin Ext", 0x100, 0x24F), ("IPA", 0x250, 0x2AF), ("Modifiers", 0x2B0, 0x2FF), ("Combining", 0x300, 0x36F),
    ("Greek", 0x370, 0x3FF), ("Cyrillic", 0x400, 0x52F), ("Armenian/Hebrew", 0x530, 0x5FF), ("Arabic", 0x600, 0x6FF),
    ("Syriac..NKo", 0x700, 0x7FF), ("Indic", 0x900, 0xDFF), ("Thai/Lao/Tibetan", 0xE00, 0xFFF),
    ("Myanmar..Ethiopic", 0x1000, 0x139F), ("Canadian..Khmer", 0x1400, 0x19FF), ("Phonetic Ext", 0x1D00, 0x1DFF),
    ("Latin Ext Add/Greek Ext", 0x1E00, 0x1FFF), ("Punctuation", 0x2000, 0x206F), ("Super/Sub/Currency", 0x2070, 0x20CF),
    ("Letterlike/Number forms", 0x2100, 0x218F), ("Arrows/Math", 0x2190, 0x22FF), ("Misc Technical", 0x2300, 0x23FF),
    ("Enclosed Alnum", 0x2460, 0x24FF), ("Box/Blocks/Shapes", 0x2500, 0x25FF), ("Misc Symbols/Dingbats", 0x2600, 0x27BF),
    ("CJK Symbols", 0x3000, 0x303F), ("Kana", 0x3040, 0x30FF), ("Hangul Jamo compat", 0x3130, 0x318F),
    ("Enclosed CJK", 0x3200, 0x32FF), ("CJK Compat", 0x3300, 0x33FF), ("CJK Ext A", 0x3400, 0x4DBF),
    ("CJK", 0x4E00, 0x9FFF), ("Yi", 0xA000, 0xA4CF), ("Hangul", 0xAC00, 0xD7A3), ("Private Use", 0xE000, 0xF8FF),
    ("CJK Compat Ideographs", 0xF900, 0xFAFF), ("Alphabetic Presentation", 0xFB00, 0xFB4F),
    ("Arabic Presentation", 0xFB50, 0xFDFF), ("Variation Selectors", 0xFE00, 0xFE0F), ("Half/Fullwidth", 0xFF00, 0xFFEF),
    ("Specials", 0xFFF0, 0xFFFF), ("Linear B..Gothic", 0x10000, 0x1034F), ("Cuneiform", 0x12000, 0x123FF),
    ("Egyptian", 0x13000, 0x1342F), ("Musical", 0x1D100, 0x1D1FF), ("Math Alnum", 0x1D400, 0x1D7FF),
    ("Emoji", 0x1F300, 0x1F6FF), ("Supplemental Symbols", 0x1F900, 0x1F9FF), ("Symbols Ext-A", 0x1FA70, 0x1FAFF),
    ("CJK Ext B", 0x20000, 0x2A6DF), ("Tags", 0xE0000, 0xE007F), ("Supplementary PUA", 0xF0000, 0xF00FF),
    ("Noncharacters", 0x10FFF0, 0x10FFFF),
]


def word(rng, script):
    lo, hi = SCRIPT_LETTERS[script]
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 9)))


def gen_code(rng):
    pieces = []
    for _ in range(rng.randint(1, 4)):
        f = rng.choice(WORDS).lower() + "_" + rng.choice(WORDS).lower()
        pieces.append(rng.choice(CODE_SNIPPETS).format(f=f, F=f.upper(), w=rng.choice(WORDS), n=rng.randint(0, 10**rng.randint(1, 9))))
    return "".join(pieces)


def gen_script(rng):
    if rng.random() < 0.5:
        lang = rng.choice(list(SENTENCES))
        parts = [rng.choice(SENTENCES[lang]) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            other = rng.choice(list(SENTENCES))
            parts.insert(rng.randint(0, len(parts)), rng.choice(SENTENCES[other]))
        return rng.choice([" ", "\n", "", "  "]).join(parts)
    script = rng.choice(list(SCRIPT_LETTERS))
    sep = " " if script not in ("han", "thai", "hiragana", "katakana") or rng.random() < 0.5 else ""
    words = [word(rng, script) for _ in range(rng.randint(1, 12))]
    if rng.random() < 0.3:
        words.insert(rng.randint(0, len(words)), word(rng, rng.choice(list(SCRIPT_LETTERS))))
    return sep.join(words) + rng.choice(["", ".", "?", "!", "。", "،", "।"])


def gen_emoji(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        kind = rng.randint(0, 6)
        if kind == 0:
            out.append(rng.choice(EMOJI_BASE))
        elif kind == 1:
            out.append(rng.choice(TONEABLE) + rng.choice(SKIN_TONES))
        elif kind == 2:
            out.append(rng.choice(ZWJ_SEQUENCES))
        elif kind == 3:
            cc = rng.choice(FLAGS)
            out.append("".join(chr(0x1F1E6 + ord(c) - ord("A")) for c in cc))
        elif kind == 4:
            out.append(rng.choice(KEYCAPS))
        elif kind == 5:
            out.append(SUBDIVISION_FLAG)
        else:
            out.append(rng.choice(WORDS))
        out.append(rng.choice(["", "", " ", "  ", "\n", "!", ", "]))
    return "".join(out)


NON_NFC = ["e\u0301", "a\u0308", "o\u0302\u0323", "\u212b", "\u2126", "\u212a", "A\u030a", "\u1100\u1161\u11a8",
           "\u0958", "\u2000", "\u1e9b\u0323", "\uf900", "\u00c5", "\u0341", "\u0344", "\u0f73", "q\u0307\u0323",
           "\u1fbe", "\u037e", "\u0387", "\ufb01", "\uff21", "\u2460", "\u00bd", "\u0e33", "\u3131",
           "\u0627\u0653", "\u0928\u093c", "\u09c7\u09be", "\u1025\u102e", "\u0b47\u0b3e", "\u05e9\u05c1\u05bc"]


def gen_combining(rng):
    out = []
    for _ in range(rng.randint(1, 10)):
        kind = rng.randint(0, 4)
        if kind == 0:
            out.append(rng.choice(NON_NFC))
        elif kind == 1:  # a base with a stack of marks in random (non-canonical) order
            out.append(rng.choice("aeiouAEIOUnsz") + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 5))))
        elif kind == 2:  # the NFD form of an accented sentence
            out.append(unicodedata.normalize("NFD", rng.choice(SENTENCES[rng.choice(["french", "vietnamese", "german", "greek", "korean"])])))
        elif kind == 3:  # a combining mark with no base, or after a space
            out.append(rng.choice(["", " ", "\n"]) + chr(rng.randint(0x300, 0x36F)))
        else:
            out.append(rng.choice(WORDS))
        out.append(rng.choice(["", " ", " ", "-"]))
    return "".join(out)


def gen_digits(rng):
    out = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.randint(0, 6)
        if kind == 0:
            out.append(str(rng.randint(0, 10 ** rng.randint(1, 40))))
        elif kind == 1:
            out.append(f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 12)}f}")
        elif kind == 2:
            out.append(f"{rng.randint(0, 10**9):,}")
        elif kind == 3:  # other decimal digit systems and No / Nl numbers
            base = rng.choice([0x660, 0x6F0, 0x966, 0x9E6, 0xE50, 0xFF10, 0x1D7CE])
            out.append("".join(chr(base + rng.randint(0, 9)) for _ in range(rng.randint(1, 12))))
        elif kind == 4:
            out.append(rng.choice(["²", "³", "¹", "½", "¾", "Ⅻ", "ⅷ", "①", "⑳", "〇", "二〇二四年", "𝟙𝟚𝟛"]))
        elif kind == 5:
            out.append(f"v{rng.randint(0, 99)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}-rc{rng.randint(0, 9)}")
        else:
            out.append("".join(rng.choice("0123456789") for _ in range(rng.randint(50, 400))))
        out.append(rng.choice([" ", "", ", ", "x", "\n", "abc", "$", "%"]))
    return "".join(out)


def gen_whitespace(rng):
    out = []
    for _ in range(rng.randint(1, 10)):
        if rng.random() < 0.6:
            out.append("".join(rng.choice(WHITESPACE_CHARS) for _ in range(rng.randint(1, 6))))
        else:
            out.append(rng.choice(WORDS + ["!", "?", "...", "—", "(x)", "12", "ab\u200dc"]))
    if rng.random() < 0.3:
        out.append(" " * rng.randint(1, 40))
    if rng.random() < 0.3:
        out.insert(0, rng.choice(["\t", "\n", " ", "\r\n"]) * rng.randint(1, 10))
    return "".join(out)


def gen_contractions(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        out.append(rng.choice(CONTRACTION_WORDS) + rng.choice(CONTRACTIONS))
        out.append(rng.choice([" ", " ", "", ", ", "\n", "'"]))
    return "".join(out)


def gen_special(rng):
    out = []
    for _ in range(rng.randint(1, 8)):
        kind = rng.randint(0, 3)
        if kind == 0:
            out.append(rng.choice(SPECIAL_PIECES))
        elif kind == 1:
            out.append(rng.choice(PARTIAL_SPECIALS))
        elif kind == 2:
            out.append(rng.choice(WORDS + ["user", "assistant", "system", "\n", " ", "  ", "hello world", "HELLO"]))
        else:  # a chat turn the way templates lay them out
            role = rng.choice(["user", "assistant", "system"])
            out.append(f"<|im_start|>{role}\n{rng.choice(SENTENCES['english'])}<|im_end|>\n")
        out.append(rng.choice(["", "", " ", "  ", "\n", "x"]))
    return "".join(out)


def gen_long_word(rng):
    kind = rng.randint(0, 5)
    n = rng.randint(100, 3000)
    if kind == 0:
        return rng.choice("ab") * n
    if kind == 1:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
    if kind == 2:
        return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(n)) + "=="
    if kind == 3:
        return "https://example.com/" + "/".join(rng.choice(WORDS) for _ in range(n // 8)) + "?q=" + "x" * 50
    if kind == 4:
        return word(rng, rng.choice(list(SCRIPT_LETTERS))) * (n // 8)
    return "".join(rng.choice(["super", "cali", "fragil", "istic", "expi", "ali", "docious"]) for _ in range(n // 5))


def gen_random_codepoints(rng):
    out = []
    for _ in range(rng.randint(1, 40)):
        _, lo, hi = rng.choice(BLOCKS)
        out.append(chr(rng.randint(lo, hi)))
        if rng.random() < 0.2:
            out.append(rng.choice([" ", "a", "1", "\n"]))
    return "".join(out)


# Blocks added in Unicode 14-16: where regex engines and normalisers of different Unicode versions
# disagree about \p{...} classes (the DeepSeek pattern's \p{S} on U+1FACF did, with Debian's onig).
RECENT_BLOCKS = [(0x1FA70, 0x1FAFF), (0x1F6D5, 0x1F6DF), (0x2EBF0, 0x2EE5D), (0x31350, 0x323AF), (0x11F00, 0x11F5F),
                 (0x1E4D0, 0x1E4FF), (0x10D40, 0x10D8F), (0x16D40, 0x16D7F), (0x1CC00, 0x1CEBF), (0x13460, 0x143FF),
                 (0x105C0, 0x105FF), (0x11BC0, 0x11BFF), (0x1E5D0, 0x1E5FF), (0x2FF0, 0x2FFF), (0x31E0, 0x31EF),
                 (0x1E030, 0x1E08F), (0x1AFF0, 0x1AFFF), (0x1B130, 0x1B16F), (0x10EC0, 0x10EFF), (0x11B00, 0x11B5F)]


def gen_recent_unicode(rng):
    out = []
    for _ in range(rng.randint(1, 12)):
        lo, hi = rng.choice(RECENT_BLOCKS)
        run = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4)))
        out.append(rng.choice(["", " ", "a", "1", "!", "\n", " x"]) + run)
    return "".join(out)


def gen_prose(rng):
    words = []
    for _ in range(rng.randint(5, 120)):
        w = rng.choice(WORDS + ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on"])
        if rng.random() < 0.1:
            w = w.capitalize()
        if rng.random() < 0.05:
            w = w.upper()
        words.append(w + rng.choice(["", "", "", "", ",", ".", ";", ":", "!", "?", "'s", " -", "\n"]))
    return " ".join(words)


# Fixed strings every tokenizer must get right; edge cases a random generator may miss.
FIXED = ["", " ", "  ", "\n", "\t", "\r\n", "a", "A", " a", "a ", "'s", "'S", "1", "12", "123", "1234", "12345",
         "hello world", "Hello World", " Hello", "Hello  world", "Hello\n\nworld", "hello\r\nworld\r\n",
         "<|im_start|>", "<|im_start|><|im_end|>", "<|endoftext|>x", "x<|endoftext|>", " <|endoftext|> ",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<think>\n\n</think>\n\n", "\ufeff", "\u00a0",
         "é", "e\u0301", "\u212b", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F1FA\U0001F1F8",
         "<mask>", " <mask> ", "a<mask>b", "<s></s>", "[NL]", "hello[NL]world", "HELLO Hello hello"]

CATEGORIES = [
    ("code", gen_code, 220), ("scripts", gen_script, 320), ("emoji", gen_emoji, 160), ("combining_nfc", gen_combining, 180),
    ("digits", gen_digits, 160), ("whitespace", gen_whitespace, 200), ("contractions", gen_contractions, 140),
    ("special_tokens", gen_special, 200), ("long_words", gen_long_word, 60), ("random_codepoints", gen_random_codepoints, 260),
    ("prose", gen_prose, 150), ("recent_unicode", gen_recent_unicode, 150),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="tests/tokenizer/corpus.jsonl")
    parser.add_argument("--seed", type=int, default=20240603)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = [("fixed", s) for s in FIXED]
    for name, gen, count in CATEGORIES:
        rows.extend((name, gen(rng)) for _ in range(count))
    counts = {}
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for i, (category, text) in enumerate(rows):
            f.write(json.dumps({"id": i, "category": category, "text": text}, ensure_ascii=False) + "\n")
            counts[category] = counts.get(category, 0) + 1
    for category, n in counts.items():
        print(f"{category:20s} {n}")
    print(f"{'total':20s} {len(rows)}  -> {args.out}")
    scripts = len(SENTENCES) + len(SCRIPT_LETTERS)
    print(f"languages with sentences: {len(SENTENCES)}, scripts with letter ranges: {len(SCRIPT_LETTERS)} ({scripts} sources)")


if __name__ == "__main__":
    sys.exit(main())
