#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/tokenizer.json: strings, chat renders and their token ids from
reference tokenizers, for tests/tokenizer.rs.

References (outside truth for weft's tokenizer):
- ids: llama.cpp's own tokenizer (llama-cpp-python, `Llama(model, vocab_only=True).tokenize(text,
  add_bos=False, special=True)`), the runtime the GGUF was made for. It applies the file's
  `tokenizer.ggml.pre` = "smollm" split (digits one by one, then the GPT-2 regex).
- chat text: Hugging Face transformers' `apply_chat_template(..., tokenize=False,
  add_generation_prompt=True)` on the tokenizer transformers builds from the same GGUF.
- transformers' ids are recorded too where they differ from llama.cpp's, as a cross-check:
  transformers' GGUF conversion drops the "smollm" pre-tokenizer (it builds a plain GPT-2
  ByteLevel pre-tokenizer without the individual-digit split), so it is not the primary reference.

Setup (torch is not needed for a tokenizer; llama-cpp-python compiles llama.cpp, ~15 min on 2 cores):
    python3 -m venv /opt/weft-tok
    /opt/weft-tok/bin/pip install transformers gguf sentencepiece protobuf tokenizers jinja2
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF" \
        /opt/weft-tok/bin/pip install llama-cpp-python
    /opt/weft-tok/bin/python tools/make_tokenizer_fixtures.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""

import argparse
import json
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(ROOT, "tests", "fixtures", "smollm2", "tokenizer.json")


# ---------------------------------------------------------------- the strings

def strings():
    out = []

    prose = [
        "Hello world",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
        "the quick brown fox",
        "It was the best of times, it was the worst of times.",
        "To be, or not to be, that is the question.",
        "Machine learning models learn patterns from data.",
        "A continuous-batching inference runtime serves many requests at once.",
        "Once upon a time, in a land far, far away, there lived a king.",
        "Please summarize the following paragraph in two sentences.",
        "What is the capital of France?",
        "The capital of France is Paris.",
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        "Write a haiku about autumn leaves.",
        "Photosynthesis converts light energy into chemical energy.",
        "She sells sea shells by the sea shore.",
        "I think, therefore I am.",
        "In 1492, Columbus sailed the ocean blue.",
        "Mr. Smith went to Washington D.C. on Jan. 5th.",
        "e.g. i.e. etc. vs. a.m. p.m.",
        "HelloWorld camelCase snake_case kebab-case SCREAMING_CASE",
        "antidisestablishmentarianism",
        "Pneumonoultramicroscopicsilicovolcanoconiosis",
        "supercalifragilisticexpialidocious",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "abababababababababab",
        "a",
        "A",
        "I",
        "ok",
        "OK.",
        "Yes/No",
        "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        "mailto:someone@example.com",
        "user.name+tag@example.co.uk",
        "#hashtag @mention $VAR %PATH%",
        "**bold** _italic_ `code` ~~strike~~",
        "# Heading\n\n- item one\n- item two\n\n1. first\n2. second",
        "| a | b |\n|---|---|\n| 1 | 2 |",
        "> quoted text\n>> nested quote",
        "$E = mc^2$ and \\frac{a}{b} + \\sqrt{x}",
        "x^2 + y^2 = z^2",
        "f(x) = 3x + 2; f'(x) = 3",
    ]
    out += prose

    numbers = [str(7 ** k) for k in range(0, 24)]  # 1 to 17 digits
    numbers += [
        "0", "00", "000", "0000000000", "42", "123", "1234", "12345", "123456", "1234567",
        "12345678", "123456789", "1234567890", "12345678901234567890",
        "3.14159", "-273.15", "+1", "1,000,000", "1 000 000", "1.000.000,50", "1e10", "6.022e23",
        "0x1F", "0b1010", "0o777", "1/2", "3:45", "12:30:45", "2024-01-15", "15/01/2024",
        "v1.2.3", "version 10.0.19045", "100%", "50 %", "$19.99", "€5", "#1", "No. 5",
        "+1 (555) 123-4567", "192.168.0.1", "2^64 = 18446744073709551616", "1st 2nd 3rd 4th",
        "Room 101, floor 3", "abc123def456", "a1b2c3", " 1", "  22", "x=1,y=2",
        "½ ¼ ¾", "² ³ ¹", "٣٤٥", "१२३", "一二三 123", "Ⅷ Ⅻ", "①②③",
    ]
    out += numbers

    punctuation = [
        "!", "?", ".", ",", "...", "!!!", "???", "?!", "!?", "…", "—", "–", "-", "--", "---",
        "\"quoted\"", "'single'", "“curly” ‘quotes’", "«guillemets»", "(parentheses)", "[brackets]",
        "{braces}", "<angle>", "@#$%^&*()", "~`|\\", "a.b.c", "a,b,c", "a;b:c", "semi;colon",
        "end.", "end!", "wait...what?", "¡Hola!", "¿Qué?", "=== title ===", "--- separator ---",
        "*****", "________", "/* comment */", "// comment", "<!-- html comment -->", "::", "->", "=>",
        "!=", "==", "<=", ">=", "&&", "||",
    ]
    out += punctuation

    contractions = [
        "don't", "Don't", "DON'T", "I'm", "I'M", "we'll", "WE'LL", "they've", "she'd", "it's",
        "It's", "IT'S", "can't", "won't", "shouldn't've", "y'all", "rock 'n' roll", "'s", "'t",
        "'re", "'ve", "'m", "'ll", "'d", "the dog's bone", "James' book", "''", "'", "O'Brien",
        "don’t (curly apostrophe)", "I'd've", "Let's go!",
    ]
    out += contractions

    code = [
        "def add(a, b):\n    return a + b\n",
        "def f(x):\n\tif x:\n\t\treturn 1\n\treturn 0\n",
        "class Foo:\n    def __init__(self):\n        self.x = 1\n\n    def bar(self):\n        pass\n",
        "fn main() {\n    println!(\"Hello, world!\");\n}\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "const x = { a: 1, b: [2, 3], c: \"four\" };",
        "{\"name\": \"weft\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"wgpu\"]}",
        "<div class=\"container\">\n  <p>Hello</p>\n</div>",
        "SELECT id, name FROM users WHERE age > 21 ORDER BY name;",
        "#!/bin/bash\nset -euo pipefail\necho \"$HOME\" | grep -c root\n",
        "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n",
        "if __name__ == \"__main__\":\n    main()\n",
        "    indented with four spaces",
        "\tindented with a tab",
        "\t\ttwo tabs",
        "        eight spaces",
        "mixed \t tab and spaces",
        "x = [1, 2, 3]\ny = {k: v for k, v in zip(x, x)}",
        "async fn step(&self) -> Result<(), Error> { Ok(()) }",
        "let v: Vec<u32> = (0..10).map(|i| i * i).collect();",
        "@media (max-width: 600px) { body { margin: 0; } }",
        "git commit -m \"fix: off-by-one in tokenizer\"",
        "a_b_c __dunder__ _private",
        "while(true){break;}",
        "matrix[i][j] += alpha * x[k];",
        "// TODO(weft): handle \\r\\n",
        "lambda x: x ** 2",
        "printf(\"%d\\n\", 42);",
    ]
    out += code

    whitespace = [
        " ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n",
        "\r", " \n ", "\n \n", " \t \n", "a  b", "a   b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a\r\nb",
        "line1\r\nline2\r\nline3", " leading space", "  two leading spaces", "trailing space ",
        "trailing spaces   ", " both ", "\nleading newline", "trailing newline\n", "text\n\n\nmore text",
        "word \n word", "tab\tseparated\tvalues", "a \u00a0b (nbsp)", "em\u2003space", "ideographic\u3000space",
        "zero\u200bwidth", "hello\u00a0", "\u00a0", "\u2028line separator", "\u000b\u000c",
        "  \n  \n  ", "end with tab\t",
    ]
    out += whitespace

    latin = [
        "café", "Café déjà vu.", "naïve résumé", "Ça va très bien, merci !", "Größe, Straße, Übung, Öl",
        "¿Dónde está la biblioteca? Mañana.", "São Paulo, Brasília, coração", "Zażółć gęślą jaźń",
        "Příliš žluťoučký kůň úpěl ďábelské ódy", "Tiếng Việt có dấu", "İstanbul'da ığdır şehir",
        "Ærøskøbing, Ålborg, Øresund", "Þingvellir, Ísland", "Façade, jalapeño, piñata",
        "e\u0301 (combining acute)", "A\u030a (combining ring)", "ﬁ ﬂ ligatures", "ǅ ǈ ǋ titlecase",
    ]
    out += latin

    scripts = [
        "Γειά σου Κόσμε", "Η γρήγορη καφέ αλεπού", "αβγδεζηθ ΑΒΓΔ",
        "Привет, мир!", "Съешь же ещё этих мягких французских булок", "Україна, Київ", "Ёжик в тумане",
        "ПРОПИСНЫЕ БУКВЫ", "Здравствуйте, как дела?",
        "你好，世界", "我爱自然语言处理。", "今天天气很好，我们去公园散步吧！", "中文和English混合",
        "繁體中文測試", "机器学习", "一",
        "こんにちは世界", "日本語のテキストです。", "カタカナとひらがな", "東京タワー",
        "안녕하세요 세계", "한국어 텍스트", "대한민국",
        "مرحبا بالعالم", "اللغة العربية جميلة", "السَّلَامُ عَلَيْكُمْ", "١٢٣ عربي",
        "שלום עולם", "עברית",
        "नमस्ते दुनिया", "हिन्दी भाषा", "मैं ठीक हूँ।", "क्षत्रिय",
        "สวัสดีชาวโลก", "ภาษาไทย",
        "বাংলা ভাষা", "தமிழ்", "ქართული", "Հայերեն", "አማርኛ", "ᚠᛇᚻ runes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙",
    ]
    out += scripts

    emoji = [
        "😀", "😀😃😄", "Hello 👋 world 🌍", "🚀", "🔥🔥🔥", "❤️", "❤", "👍", "👍🏽", "👍🏿",
        "👋🏻 👋🏼 👋🏽 👋🏾 👋🏿", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏽‍🚀", "🏳️‍🌈", "🇺🇸🇫🇷🇯🇵", "1️⃣ 2️⃣ #️⃣",
        "☕ tea ☕", "I ❤️ NY", "🤖: beep boop", "👨🏻‍❤️‍💋‍👨🏼", "🐈‍⬛", "©®™", "✓✗★☆",
        "→←↑↓⇒", "∑∫√∞≠≤≥±", "€£¥₹₿", "♠♥♦♣", "🀄🃏", "𓀀",
    ]
    out += emoji

    special = [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHi<|im_end|>",
        "<|im_start|>assistant\n", "text<|im_end|>more", "<|im_start|><|im_end|>",
        "<|im_start|", "|im_start|>", "< |im_start| >", "<|IM_START|>", "<|im_start|>system",
        "<repo_name>weft<file_sep>src/lib.rs", "<s>", "</s>", "<|endoftext|><|endoftext|>",
    ]
    out += special

    misc = [
        "",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore "
        "et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut "
        "aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in voluptate velit esse "
        "cillum dolore eu fugiat nulla pariatur. Excepteur sint occaecat cupidatat non proident, sunt in culpa "
        "qui officia deserunt mollit anim id est laborum.",
        "=" * 40,
        "-" * 17,
        "😀" * 10,
        "你好" * 12,
        "ab" * 50,
        "The year 2024 had 366 days; 2023 had 365.",
        "Temperature: -5°C (23°F)",
        "Price: $1,234.56 (incl. 20% VAT)",
        "ISBN 978-3-16-148410-0",
        "Order #A1B2-C3D4 shipped 3x items",
        "User: What's 2+2?\nAssistant: 2+2 = 4.",
        "Q: Why?\nA: Because.\n\nQ: How?\nA: Like this.",
        "mixed English, русский, 中文, العربية, हिन्दी and 😀 in one line",
        "Tab\tnewline\ncarriage\rreturn",
        "NULL-ish \u0001\u0002 control chars",
        "\u00ad soft hyphen",
        "\ufeffBOM at start",
        "\ufffd replacement char",
    ]
    out += misc

    seen = set()
    unique = []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


CONVERSATIONS = [
    # no system message: the template inserts its default one
    [{"role": "user", "content": "What is the capital of France?"}],
    # with a system message
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "Name a primary colour."},
    ],
    # multi-turn with a system message
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hi! Can you count to 12?"},
        {"role": "assistant", "content": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12."},
        {"role": "user", "content": "Now backwards, please."},
    ],
    # multi-turn, no system message, unicode and multi-line content
    [
        {"role": "user", "content": "Translate to French:\n\n  \"Good morning 👋, how are you?\""},
        {"role": "assistant", "content": "« Bonjour 👋, comment allez-vous ? »"},
        {"role": "user", "content": "And in 日本語?\tThanks!"},
    ],
]


# Extra templates that exercise what Hugging Face chat templates use (rendered by transformers'
# own Jinja environment: trim_blocks, lstrip_blocks, loop controls, tojson, raise_exception, ...).
TEMPLATE_CASES = [
    {
        "name": "llama3-style with tojson and strip",
        "template": (
            "{{- bos_token }}\n"
            "{%- if messages[0]['role'] == 'system' %}\n"
            "    {%- set system_message = messages[0]['content']|trim %}\n"
            "    {%- set messages = messages[1:] %}\n"
            "{%- else %}\n"
            "    {%- set system_message = \"\" %}\n"
            "{%- endif %}\n"
            "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
            "{{- system_message }}\n"
            "{{- \"<|eot_id|>\" }}\n"
            "{%- for message in messages %}\n"
            "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
            "{%- endfor %}\n"
            "{%- if add_generation_prompt %}\n"
            "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
            "{%- endif %}\n"
            "{{- '\\n' + (messages | map(attribute='role') | list | tojson) }}\n"
            "{{- '\\n' + ({'z': 1, 'a': [1.5, None, true, 'é\"<>'], 'm': {}} | tojson) }}\n"
            "{{- '\\n' + ({'b': 2, 'a': 1} | tojson(indent=2, sort_keys=true)) }}\n"
        ),
    },
    {
        "name": "trim_blocks / lstrip_blocks, loop controls and python string methods",
        "template": (
            "{% for message in messages %}\n"
            "    {% if loop.index0 >= 3 %}{% break %}{% endif %}\n"
            "    {% if message.role == 'system' %}{% continue %}{% endif %}\n"
            "[{{ loop.index }}/{{ loop.length }}] {{ message.role.upper() }}: {{ message.content.strip() }}\n"
            "    {% if message.content.startswith('Hi') %}\n"
            "  (greeting; {{ message.content.split(' ') | length }} words, {{ message.content.replace('!', '?') }})\n"
            "    {% endif %}\n"
            "{% endfor %}\n"
            "{% set ns = namespace(count=0) %}\n"
            "{% for m in messages if m.role == 'user' %}{% set ns.count = ns.count + 1 %}{% endfor %}\n"
            "users={{ ns.count }} last={{ messages[-1]['role'] }}{{ ' ' + eos_token if not add_generation_prompt }}\n"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    },
    {
        "name": "qwen2-style with tools none and get",
        "template": (
            "{%- if tools %}TOOLS{%- endif %}\n"
            "{%- for message in messages %}\n"
            "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\") %}\n"
            "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
            "    {%- elif message.role == \"system\" %}\n"
            "        {{- '<|im_start|>system\\n' + message.get('content', '') + '<|im_end|>\\n' }}\n"
            "    {%- endif %}\n"
            "{%- endfor %}\n"
            "{%- if add_generation_prompt %}\n"
            "    {{- '<|im_start|>assistant\\n' }}\n"
            "{%- endif %}\n"
        ),
    },
]

RAISING_TEMPLATE = (
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{{ message['content'] }}{% endfor %}"
)


# ---------------------------------------------------------------- references

def load_transformers_tokenizer(model_path):
    """transformers' tokenizer from the GGUF. AutoTokenizer needs torch to rebuild a llama config
    from a GGUF; without torch, the tokenizer class itself reads the GGUF (the same conversion).
    transformers' GGUF reader imports torch only for tensor dtypes, so a placeholder module is
    enough for the tokenizer path."""
    directory, name = os.path.split(os.path.abspath(model_path))
    try:
        import torch  # noqa: F401
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(directory, gguf_file=name), "AutoTokenizer"
    except ImportError:
        pass
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import is_torch_available

    is_torch_available()  # cached False before the placeholder exists
    placeholder = types.ModuleType("torch")
    placeholder.__getattr__ = lambda _name: type("TorchPlaceholder", (), {})
    sys.modules["torch"] = placeholder
    try:
        import transformers.integrations.gguf.reader  # noqa: F401  (binds the placeholder)
    finally:
        del sys.modules["torch"]

    return (
        PreTrainedTokenizerFast.from_pretrained(directory, gguf_file=name),
        "PreTrainedTokenizerFast (torch absent)",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()

    import llama_cpp
    import transformers

    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)

    def llama_ids(text):
        return llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def llama_text(ids):
        return llm.detokenize(ids, special=True).decode("utf-8", errors="replace")

    hf, hf_loader = load_transformers_tokenizer(args.model)

    def hf_ids(text):
        return hf.encode(text, add_special_tokens=False)

    cases = []
    disagreements = []
    for text in strings():
        ids = llama_ids(text)
        case = {"text": text, "ids": ids}
        tf = hf_ids(text)
        if tf != ids:
            case["transformers_ids"] = tf
            disagreements.append(text)
        back = llama_text(ids)
        if back != text:
            case["llama_cpp_decoded"] = back
        cases.append(case)

    chats = []
    for messages in CONVERSATIONS:
        text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        chat = {"messages": messages, "add_generation_prompt": True, "text": text, "ids": llama_ids(text)}
        tf = hf_ids(text)
        if tf != chat["ids"]:
            chat["transformers_ids"] = tf
        chats.append(chat)

    templates = []
    for case in TEMPLATE_CASES:
        for messages in CONVERSATIONS[1:3]:
            for add_generation_prompt in (True, False):
                text = hf.apply_chat_template(
                    messages,
                    chat_template=case["template"],
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                )
                templates.append(
                    {
                        "name": case["name"],
                        "template": case["template"],
                        "messages": messages,
                        "add_generation_prompt": add_generation_prompt,
                        "text": text,
                    }
                )
    try:
        hf.apply_chat_template(
            [{"role": "assistant", "content": "x"}], chat_template=RAISING_TEMPLATE, tokenize=False
        )
        raise SystemExit("the raising template did not raise in transformers")
    except Exception as e:  # jinja2 TemplateError
        raising = {"template": RAISING_TEMPLATE, "messages": [{"role": "assistant", "content": "x"}], "error": str(e)}

    fixture = {
        "about": "Token ids of SmolLM2-135M-Instruct (GGUF) for tests/tokenizer.rs; written by "
        "tools/make_tokenizer_fixtures.py. ids: llama.cpp tokenize(text, add_bos=False, special=True). "
        "chat text: transformers apply_chat_template(tokenize=False). transformers_ids: "
        "transformers' GGUF tokenizer, recorded only where it differs from llama.cpp.",
        "model": os.path.basename(args.model),
        "llama_cpp_python": llama_cpp.__version__,
        "transformers": transformers.__version__,
        "transformers_loader": hf_loader,
        "bos_token_id": llm.token_bos(),
        "eos_token_id": llm.token_eos(),
        "vocab_size": llm.n_vocab(),
        "transformers_disagreements": len(disagreements),
        "cases": cases,
        "chat": chats,
        "templates": templates,
        "raising_template": raising,
    }

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        # one case per line: readable diffs without a huge file
        f.write("{\n")
        keys = list(fixture)
        for i, key in enumerate(keys):
            value = fixture[key]
            sep = "," if i + 1 < len(keys) else ""
            if isinstance(value, list):
                f.write(f"  {json.dumps(key)}: [\n")
                for j, item in enumerate(value):
                    comma = "," if j + 1 < len(value) else ""
                    f.write(f"    {json.dumps(item, ensure_ascii=False)}{comma}\n")
                f.write(f"  ]{sep}\n")
            else:
                f.write(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{sep}\n")
        f.write("}\n")

    print(f"wrote {args.out}: {len(cases)} strings, {len(chats)} chats, {len(templates)} template renders")
    print(f"transformers' GGUF tokenizer differs from llama.cpp on {len(disagreements)} strings")
    for text in disagreements[:20]:
        print("   ", repr(text))


if __name__ == "__main__":
    main()
