"""Text from the reference engine with a configuration a sweep chose (`autoinfer engine generate`, or
`python -m autoinfer.refengine.generate`): the same flags as the worker that measured it, a prompt instead of random
tokens. The model's own tokenizer comes from its GGUF (transformers reads it); the text streams to stdout, and the
prompt's and the generation's speed go to stderr, so what a user runs is the configuration the sweep timed.
Exit status 2: bad input (one line on stderr); 4: out of memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Iterator

from autoinfer.refengine.worker import EXIT_REJECTED, reported

EXIT_INPUT = EXIT_REJECTED  # bad input (out of memory: the worker's EXIT_OOM, 4)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line and exit status 2, as every autoinfer command says a usage error (argparse adds the usage)."""
        self.exit(EXIT_INPUT, f"error: {message} (`{self.prog} --help` lists the flags)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from autoinfer.refengine.options import add_arguments

    p = _Parser(prog="autoinfer engine generate",
                description="Generate text with the reference engine; flags as the worker takes.")
    p.add_argument("--model", required=True, help="a qwen35moe GGUF with its tokenizer")
    add_arguments(p)  # one flag per engine knob (refengine/options.py)
    p.add_argument("--prompt", help="the prompt text (default: read from stdin)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--prompt-tokens", type=int, help="repeat the prompt's tokens to exactly this many (a prompt as "
                   "long as a measurement's, as the deployment check sends)")
    p.add_argument("--n-predict", type=int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): the most likely token each step")
    p.add_argument("--seed", type=int, default=0, help="for sampling at a temperature above 0")
    p.add_argument("--ignore-eos", action="store_true", help="go on past the end-of-sequence token")
    return p.parse_args(argv)


def load_tokenizer(model: Path):
    """The tokenizer the GGUF carries (tokenizer.ggml.*), through transformers."""
    from autoinfer.errors import UserError
    from autoinfer.model.gguf_header import GGUFFormatError, read_header

    try:
        metadata = read_header(model).metadata
    except GGUFFormatError as exc:
        raise UserError(f"{model} is not a readable GGUF file ({exc}); pass a .gguf model") from None
    if "tokenizer.ggml.tokens" not in metadata:
        raise UserError(f"{model} carries no tokenizer (tokenizer.ggml.model is {metadata.get('tokenizer.ggml.model')!r}"
                        ", no tokens); generate needs a GGUF with one, as `autoinfer model synth --tokenizer qwen35` "
                        "writes")
    try:
        from transformers import AutoTokenizer
    except ModuleNotFoundError:
        raise UserError("transformers is not installed; pip install 'autoinfer[engine]'") from None
    return AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)


def prompt_ids(tokenizer, text: str, chat: bool) -> list[int]:
    from autoinfer.errors import UserError

    if not chat:
        return tokenizer(text)["input_ids"]
    if not tokenizer.chat_template:
        raise UserError("the model's GGUF has no chat template (tokenizer.chat_template); drop --chat")
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))


def tokens(engine, ids: list[int], n_predict: int, temperature: float, seed: int,
           stop: set[int]) -> Iterator[int]:
    """The generated tokens one by one: the prompt's prefill, then one decode step a token."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def pick(logits: torch.Tensor) -> int:
        last = logits[-1].float().cpu()
        if temperature <= 0:
            return int(last.argmax())
        return int(torch.multinomial(torch.softmax(last / temperature, dim=-1), 1, generator=gen))

    logits, state = engine.prefill(ids)
    for i in range(n_predict):
        token = pick(logits)
        yield token
        if token in stop or i == n_predict - 1:
            return
        logits = engine.decode(token, state)


def run(args: argparse.Namespace) -> None:
    from autoinfer.errors import UserError
    from autoinfer.refengine.engine import ReferenceEngine
    from autoinfer.refengine.options import from_namespace

    model = Path(args.model)
    if not model.is_file():
        raise UserError(f"model file {model} does not exist; pass a .gguf path (or `autoinfer model synth`)")
    if args.n_predict < 1:
        raise UserError(f"--n-predict {args.n_predict}: generate at least 1 token")
    options = from_namespace(args)
    tokenizer = load_tokenizer(model)
    text = args.prompt if args.prompt is not None else sys.stdin.read()
    ids = prompt_ids(tokenizer, text, args.chat)
    if not ids:
        raise UserError("the prompt is empty; pass --prompt TEXT or text on stdin")
    if args.prompt_tokens is not None:
        if args.prompt_tokens < 1:
            raise UserError(f"--prompt-tokens {args.prompt_tokens}: give at least 1")
        ids = (ids * -(-args.prompt_tokens // len(ids)))[:args.prompt_tokens]
    if len(ids) + args.n_predict > options.max_context:
        raise UserError(f"the prompt's {len(ids)} tokens and --n-predict {args.n_predict} exceed max_context "
                        f"{options.max_context}; raise --max-context or generate fewer tokens")
    engine = ReferenceEngine.from_gguf(model, options)
    stop = set() if args.ignore_eos or tokenizer.eos_token_id is None else {tokenizer.eos_token_id}
    started = time.perf_counter()
    out: list[int] = []
    shown, prompt_s = "", None
    for token in tokens(engine, ids, args.n_predict, args.temperature, args.seed, stop):
        if prompt_s is None:
            engine.sync()
            prompt_s = time.perf_counter() - started
        out.append(token)
        text = tokenizer.decode(out, skip_special_tokens=True)
        if not text.endswith("\ufffd"):  # a character whose bytes span tokens waits for its last one
            print(text[len(shown):], end="", flush=True)
            shown = text
    engine.sync()
    gen_s = time.perf_counter() - started - prompt_s
    print(tokenizer.decode(out, skip_special_tokens=True)[len(shown):])
    decoded = len(out) - 1  # the first token came from the prompt's logits
    print(f"prompt: {len(ids)} tokens in {prompt_s:.2f} s, {len(ids) / prompt_s:.1f} tok/s; generated: {len(out)} "
          f"tokens" + (f", {decoded / gen_s:.1f} tok/s" if decoded and gen_s > 0 else ""), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return reported(lambda: run(args), EXIT_INPUT)[0]

if __name__ == "__main__":
    sys.exit(main())
