"""The real `nectar serve` on the demo model, driven by the official OpenAI and Anthropic SDKs.

Run by `crates/nectar-cli/tests/sdk.rs`, which starts the server (with an API key, 8 rows of
continuous batching) and passes its address in NECTAR_BASE_URL and the key in NECTAR_API_KEY.
Decoding is greedy unless a test says otherwise, so outputs are deterministic.
"""

import json
import os
import threading
import time
import unittest
import urllib.error
import urllib.request

import anthropic
import openai

BASE = os.environ["NECTAR_BASE_URL"]  # http://127.0.0.1:PORT
KEY = os.environ["NECTAR_API_KEY"]
MODEL = "nectar-demo-glm5"
HARBOR = 'Define the word "harbor".'
# The demo's reference greedy answer to HARBOR starts with this.
HARBOR_REF = "harbor \\harbor\\ n."


def oai(key=KEY):
    return openai.OpenAI(base_url=BASE + "/v1", api_key=key, max_retries=0, timeout=120)


def ant(key=KEY):
    return anthropic.Anthropic(base_url=BASE, api_key=key, max_retries=0, timeout=120)


def chat(client, content, max_tokens, **kw):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        **kw,
    )
    return r


def chat_stream_text(client, content, max_tokens):
    text = ""
    usage = None
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
    return text, usage


def stats():
    req = urllib.request.Request(BASE + "/stats", headers={"Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


class OpenAIChat(unittest.TestCase):
    def test_models_lists_the_demo(self):
        # The served model first, then every --alias the server was started with.
        models = oai().models.list()
        ids = [m.id for m in models.data]
        self.assertEqual(ids, [MODEL, "nectar-alias", "gpt-4o-mini"])
        self.assertEqual(oai().models.retrieve("gpt-4o-mini").id, "gpt-4o-mini")
        self.assertEqual([m.id for m in ant().models.list().data][1:], ["nectar-alias", "gpt-4o-mini"])

    def test_non_streaming_matches_the_reference(self):
        r = chat(oai(), HARBOR, 12)
        msg = r.choices[0].message
        self.assertTrue(msg.content.startswith(HARBOR_REF), msg.content)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 12)
        self.assertGreater(r.usage.prompt_tokens, 0)

    def test_streaming_equals_non_streaming(self):
        whole = chat(oai(), HARBOR, 12).choices[0].message.content
        text, usage = chat_stream_text(oai(), HARBOR, 12)
        self.assertEqual(text, whole)
        self.assertEqual(usage.completion_tokens, 12)

    def test_seeded_sampling_is_reproducible(self):
        a = chat(oai(), HARBOR, 8, temperature=1.0, seed=11).choices[0].message.content
        b = chat(oai(), HARBOR, 8, temperature=1.0, seed=11).choices[0].message.content
        self.assertEqual(a, b)

    def test_stop_string(self):
        r = chat(oai(), HARBOR, 12, stop=["\\"])
        self.assertEqual(r.choices[0].message.content, "harbor ")
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_tool_call_round_trip(self):
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look a word up in the dictionary.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "word": {"type": "string", "maxLength": 12},
                            "limit": {"type": "integer", "minimum": 1, "maximum": 9},
                        },
                        "required": ["word", "limit"],
                    },
                },
            }
        ]
        messages = [{"role": "user", "content": HARBOR}]
        r = oai().chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "lookup"}},
            max_tokens=80,
        )
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        call = r.choices[0].message.tool_calls[0]
        self.assertEqual(call.function.name, "lookup")
        args = json.loads(call.function.arguments)
        self.assertIsInstance(args["word"], str)
        self.assertTrue(1 <= args["limit"] <= 9, args)
        # The client runs the tool and sends the result back.
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "a sheltered port"})
        final = oai().chat.completions.create(
            model=MODEL, messages=messages, tools=tools, max_tokens=8
        )
        self.assertIsInstance(final.choices[0].message.content, str)
        self.assertGreater(final.usage.prompt_tokens, r.usage.prompt_tokens)

    def test_json_schema_output_parses_and_validates(self):
        schema = {
            "type": "object",
            "properties": {
                "word": {"type": "string", "maxLength": 16},
                "letters": {"type": "integer", "minimum": 1, "maximum": 30},
                "kind": {"type": "string", "enum": ["noun", "verb"]},
            },
            "required": ["word", "letters", "kind"],
            "additionalProperties": False,
        }
        for temperature in (0.0, 1.0):
            r = chat(
                oai(),
                HARBOR,
                80,
                temperature=temperature,
                seed=5,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "word", "schema": schema, "strict": True},
                },
            )
            self.assertEqual(r.choices[0].finish_reason, "stop")
            v = json.loads(r.choices[0].message.content)
            self.assertEqual(set(v), {"word", "letters", "kind"})
            self.assertIsInstance(v["word"], str)
            self.assertLessEqual(len(v["word"]), 16)
            self.assertTrue(1 <= v["letters"] <= 30)
            self.assertIn(v["kind"], ("noun", "verb"))

    def test_eight_concurrent_streams_equal_their_solo_outputs(self):
        words = ["harbor", "anchor", "river", "mountain", "lantern", "garden", "window", "silver"]
        prompts = ['Define the word "%s".' % w for w in words]
        solo = [chat(oai(), p, 16).choices[0].message.content for p in prompts]
        before = stats()["batch"]
        results = [None] * len(prompts)

        def worker(i):
            results[i] = chat_stream_text(oai(), prompts[i], 16)[0]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results, solo)
        after = stats()["batch"]
        rows = after["rows"] - before["rows"]
        steps = after["steps"] - before["steps"]
        self.assertGreater(rows, steps, "the streams never shared a forward")

    def test_client_disconnect_mid_stream_then_healthy(self):
        cancelled = stats()["requests"]["cancelled"]
        stream = oai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a very long story."}],
            max_tokens=3000,
            stream=True,
        )
        got = 0
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                got += 1
            if got >= 3:
                break
        stream.close()
        deadline = time.time() + 30
        while stats()["requests"]["cancelled"] == cancelled:
            self.assertLess(time.time(), deadline, "the generation was not cancelled")
            time.sleep(0.05)
        self.assertTrue(chat(oai(), HARBOR, 6).choices[0].message.content.startswith("harbor"))


class OpenAICompletionsAndResponses(unittest.TestCase):
    def test_completions_text_prompt(self):
        r = oai().completions.create(model=MODEL, prompt="And God said", max_tokens=5)
        self.assertEqual(r.usage.completion_tokens, 5)
        self.assertTrue(r.choices[0].text)

    def test_responses_previous_response_id(self):
        c = oai()
        first = c.responses.create(model=MODEL, input=HARBOR, max_output_tokens=8)
        self.assertEqual(first.status, "incomplete")
        self.assertTrue(first.output_text.startswith("harbor"), first.output_text)
        second = c.responses.create(
            model=MODEL,
            input="And the word anchor?",
            previous_response_id=first.id,
            max_output_tokens=8,
        )
        self.assertTrue(second.output_text)
        # The second turn's prompt holds the first exchange.
        self.assertGreater(
            second.usage.input_tokens, first.usage.input_tokens + first.usage.output_tokens
        )
        fetched = c.responses.retrieve(first.id)
        self.assertEqual(fetched.output_text, first.output_text)

    def test_responses_streaming_events(self):
        kinds = []
        text = ""
        last = None
        stream = oai().responses.create(
            model=MODEL, input=HARBOR, max_output_tokens=8, stream=True
        )
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            last = ev
        self.assertEqual(kinds[:2], ["response.created", "response.in_progress"])
        self.assertIn("response.output_text.done", kinds)
        # The token budget ran out: the official terminal event for that is `incomplete`.
        self.assertEqual(last.type, "response.incomplete")
        self.assertEqual(last.response.incomplete_details.reason, "max_output_tokens")
        self.assertEqual(last.response.output_text, text)


class AnthropicMessages(unittest.TestCase):
    def test_messages_and_stream(self):
        m = ant().messages.create(
            model=MODEL, max_tokens=12, messages=[{"role": "user", "content": HARBOR}]
        )
        self.assertEqual(m.stop_reason, "max_tokens")
        text = "".join(b.text for b in m.content if b.type == "text")
        self.assertTrue(text.startswith(HARBOR_REF), text)
        with ant().messages.stream(
            model=MODEL, max_tokens=12, messages=[{"role": "user", "content": HARBOR}]
        ) as s:
            streamed = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(streamed, text)
        self.assertEqual(final.usage.output_tokens, 12)

    def test_tool_use_and_tool_result_blocks(self):
        tools = [
            {
                "name": "lookup",
                "description": "Look a word up in the dictionary.",
                "input_schema": {
                    "type": "object",
                    "properties": {"word": {"type": "string"}},
                    "required": ["word"],
                },
            }
        ]
        messages = [
            {"role": "user", "content": HARBOR},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"word": "harbor"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a sheltered port"}
                ],
            },
        ]
        m = ant().messages.create(model=MODEL, max_tokens=8, tools=tools, messages=messages)
        self.assertIn(m.stop_reason, ("end_turn", "max_tokens", "tool_use", "stop_sequence"))
        n = ant().messages.count_tokens(model=MODEL, tools=tools, messages=messages)
        self.assertEqual(n.input_tokens, m.usage.input_tokens)

    def test_forced_tool_use_round_trip(self):
        tools = [
            {
                "name": "lookup",
                "description": "Look a word up in the dictionary.",
                "input_schema": {
                    "type": "object",
                    "properties": {"word": {"type": "string", "maxLength": 12}},
                    "required": ["word"],
                },
            }
        ]
        messages = [{"role": "user", "content": HARBOR}]
        m = ant().messages.create(
            model=MODEL,
            max_tokens=80,
            tools=tools,
            tool_choice={"type": "tool", "name": "lookup"},
            messages=messages,
        )
        self.assertEqual(m.stop_reason, "tool_use")
        use = [b for b in m.content if b.type == "tool_use"][0]
        self.assertEqual(use.name, "lookup")
        self.assertIsInstance(use.input["word"], str)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in m.content]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "a sheltered port"}
                ],
            }
        )
        final = ant().messages.create(model=MODEL, max_tokens=8, tools=tools, messages=messages)
        self.assertIn(final.stop_reason, ("end_turn", "max_tokens"))

    def test_count_tokens(self):
        msgs = [{"role": "user", "content": HARBOR}]
        n = ant().messages.count_tokens(model=MODEL, messages=msgs)
        m = ant().messages.create(model=MODEL, max_tokens=1, messages=msgs)
        self.assertEqual(n.input_tokens, m.usage.input_tokens)
        self.assertGreater(n.input_tokens, 3)


LOOKUP_PARAMS = {
    "type": "object",
    # No bounds on either: the grammar's plan must bound them to fit the budget.
    "properties": {"word": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["word", "limit"],
}
OAI_LOOKUP = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up in the dictionary.",
            "parameters": LOOKUP_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {"name": "define", "parameters": {"type": "object", "properties": {}}},
    },
]
ANT_LOOKUP = [
    {"name": "lookup", "description": "Look a word up.", "input_schema": LOOKUP_PARAMS}
]
FORCE_LOOKUP = {"type": "function", "function": {"name": "lookup"}}


def demo_token_id(text):
    """The demo tokenizer's id of one token's text (byte-level BPE, GPT-2's byte alphabet)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "models", MODEL, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    alphabet = dict(zip(bs, map(chr, cs)))
    return vocab["".join(alphabet[b] for b in text.encode("utf-8"))]


def no_markup(test, text):
    for tag in ("<tool_call>", "<arg_key>", "<arg_value>", "</tool_call>"):
        test.assertNotIn(tag, text or "")


class Deviations(unittest.TestCase):
    """Issue 13's protocol deviations D1-D10, each through the official SDKs."""

    def test_d1_forced_call_within_the_budget_closes_and_parses(self):
        # The minimal call counted as the plan counts it (each tag one token, every other
        # character one): 2 tags, "lookup\n", per argument 4 tags, 2 newlines, its key and a
        # one-character value. Every budget from there up must close the call.
        minimal = 2 + len("lookup\n") + 2 * (4 + 2 + 1) + len("word") + len("limit")
        self.assertEqual(minimal, 32)
        for max_tokens in (minimal, minimal + 5, 64):
            r = oai().chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": HARBOR}],
                tools=OAI_LOOKUP,
                tool_choice=FORCE_LOOKUP,
                max_tokens=max_tokens,
            )
            choice = r.choices[0]
            self.assertEqual(choice.finish_reason, "tool_calls", max_tokens)
            no_markup(self, choice.message.content)
            args = json.loads(choice.message.tool_calls[0].function.arguments)
            self.assertIsInstance(args["word"], str)
            self.assertIsInstance(args["limit"], int)
            self.assertLessEqual(r.usage.completion_tokens, max_tokens)

    def test_d1_a_call_cut_by_max_tokens_is_a_call_everywhere(self):
        # Too small for the minimal call: it is cut, and comes back as a (cut) call.
        r = oai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": HARBOR}],
            tools=OAI_LOOKUP,
            tool_choice=FORCE_LOOKUP,
            max_tokens=6,
        )
        self.assertEqual(r.choices[0].finish_reason, "length")
        no_markup(self, r.choices[0].message.content)
        self.assertEqual(r.choices[0].message.tool_calls[0].function.name, "lookup")
        json.loads(r.choices[0].message.tool_calls[0].function.arguments)
        stream = oai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": HARBOR}],
            tools=OAI_LOOKUP,
            tool_choice=FORCE_LOOKUP,
            max_tokens=6,
            stream=True,
        )
        content, finish, names = "", None, []
        for chunk in stream:
            for c in chunk.choices:
                content += c.delta.content or ""
                for tc in c.delta.tool_calls or []:
                    if tc.function and tc.function.name:
                        names.append(tc.function.name)
                finish = c.finish_reason or finish
        self.assertEqual((content, finish, names), ("", "length", ["lookup"]))
        resp = oai().responses.create(
            model=MODEL,
            input=HARBOR,
            tools=[dict(type="function", **t["function"]) for t in OAI_LOOKUP],
            tool_choice={"type": "function", "name": "lookup"},
            max_output_tokens=6,
        )
        self.assertEqual(resp.status, "incomplete")
        self.assertEqual([i.type for i in resp.output], ["function_call"])
        self.assertEqual(resp.output[0].status, "incomplete")
        m = ant().messages.create(
            model=MODEL,
            max_tokens=6,
            tools=ANT_LOOKUP,
            tool_choice={"type": "tool", "name": "lookup"},
            messages=[{"role": "user", "content": HARBOR}],
        )
        self.assertEqual(m.stop_reason, "max_tokens")
        self.assertEqual([b.type for b in m.content], ["tool_use"])

    def test_tool_call_arguments_stream_as_generated(self):
        stream = oai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": HARBOR}],
            tools=OAI_LOOKUP,
            tool_choice=FORCE_LOOKUP,
            max_tokens=60,
            stream=True,
        )
        fragments = []
        for chunk in stream:
            for c in chunk.choices:
                for tc in c.delta.tool_calls or []:
                    if tc.function and tc.function.arguments:
                        fragments.append(tc.function.arguments)
        # The string value arrives token by token, not in one piece at the end.
        self.assertGreater(len(fragments), 3, fragments)
        json.loads("".join(fragments))

    def test_d2_anthropic_message_delta_carries_input_tokens(self):
        msgs = [{"role": "user", "content": HARBOR}]
        n = ant().messages.count_tokens(model=MODEL, messages=msgs).input_tokens
        seen = None
        with ant().messages.stream(model=MODEL, max_tokens=4, messages=msgs) as s:
            for ev in s:
                if ev.type == "message_delta":
                    seen = ev.usage.input_tokens
        self.assertEqual(seen, n)

    def test_d3_a_response_format_beside_a_forced_call(self):
        fmt = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        }
        r = oai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": HARBOR}],
            tools=OAI_LOOKUP,
            tool_choice=FORCE_LOOKUP,
            response_format=fmt,
            max_tokens=40,
        )
        self.assertEqual(r.choices[0].message.tool_calls[0].function.name, "lookup")
        resp = oai().responses.create(
            model=MODEL,
            input=HARBOR,
            tools=[dict(type="function", **OAI_LOOKUP[0]["function"])],
            tool_choice="required",
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            max_output_tokens=40,
        )
        self.assertEqual(resp.output[0].type, "function_call")

    def test_d4_anthropic_structured_outputs(self):
        import pydantic

        class Word(pydantic.BaseModel):
            word: str
            letters: int

        m = ant().messages.parse(
            model=MODEL,
            max_tokens=60,
            messages=[{"role": "user", "content": HARBOR}],
            output_format=Word,
        )
        self.assertIsInstance(m.parsed_output, Word)
        schema = {
            "type": "object",
            "properties": {"kind": {"type": "string", "enum": ["noun", "verb"]}},
            "required": ["kind"],
            "additionalProperties": False,
        }
        m = ant().messages.create(
            model=MODEL,
            max_tokens=30,
            messages=[{"role": "user", "content": HARBOR}],
            output_config={"format": {"type": "json_schema", "schema": schema}},
        )
        self.assertIn(json.loads(m.content[0].text)["kind"], ("noun", "verb"))

    def test_d5_allowed_tools(self):
        r = oai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": HARBOR}],
            tools=OAI_LOOKUP,
            tool_choice={
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "required",
                    "tools": [{"type": "function", "function": {"name": "define"}}],
                },
            },
            max_tokens=20,
        )
        self.assertEqual(r.choices[0].message.tool_calls[0].function.name, "define")
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")

    def test_d6_echo_logprobs_cover_the_prompt(self):
        prompt = [100, 200, 300]
        step = oai().completions.create(model=MODEL, prompt=prompt, max_tokens=1, logprobs=1)
        text, lp = step.choices[0].logprobs.tokens[0], step.choices[0].logprobs.token_logprobs[0]
        # Echo the prompt continued by that token: the prompt pass must give the token the
        # logprob decoding gave it.
        ids = prompt + [demo_token_id(text)]
        r = oai().completions.create(model=MODEL, prompt=ids, max_tokens=1, echo=True, logprobs=1)
        got = r.choices[0].logprobs
        self.assertEqual(len(got.tokens), len(ids) + 1)
        self.assertIsNone(got.token_logprobs[0])
        self.assertIsNone(got.top_logprobs[0])
        self.assertEqual(got.tokens[3], text)
        self.assertAlmostEqual(got.token_logprobs[3], lp, delta=1e-3)
        self.assertEqual(got.text_offset[0], 0)
        self.assertTrue(all(x <= 0 for x in got.token_logprobs[1:]), got.token_logprobs)

    def test_d7_unknown_model_is_404_aliases_are_served(self):
        with self.assertRaises(openai.NotFoundError) as cm:
            oai().chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "x"}], max_tokens=1
            )
        self.assertEqual(cm.exception.code, "model_not_found")
        with self.assertRaises(anthropic.NotFoundError):
            ant().messages.create(
                model="no-such-model", max_tokens=1, messages=[{"role": "user", "content": "x"}]
            )
        for alias in ("nectar-alias", "gpt-4o-mini"):
            r = oai().chat.completions.create(
                model=alias, messages=[{"role": "user", "content": HARBOR}], max_tokens=2
            )
            self.assertEqual(r.model, MODEL)

    def test_d8_responses_report_the_sampling_used(self):
        r = oai().responses.create(model=MODEL, input=HARBOR, max_output_tokens=2)
        self.assertEqual((r.temperature, r.top_p), (0.0, 1.0))
        r = oai().responses.create(
            model=MODEL, input=HARBOR, max_output_tokens=2, temperature=0.7, top_p=0.8
        )
        self.assertEqual((r.temperature, r.top_p), (0.7, 0.8))

    def test_d9_thinking_enabled_with_empty_reasoning_keeps_its_block(self):
        msgs = [{"role": "user", "content": HARBOR}]
        thinking = {"type": "enabled", "budget_tokens": 1024}
        m = ant().messages.create(model=MODEL, max_tokens=3, thinking=thinking, messages=msgs)
        # The demo closes its reasoning at once: the thinking block is there, empty.
        self.assertEqual((m.content[0].type, m.content[0].thinking), ("thinking", ""))
        self.assertEqual(m.content[1].type, "text")
        with ant().messages.stream(
            model=MODEL, max_tokens=3, thinking=thinking, messages=msgs
        ) as s:
            final = s.get_final_message()
        self.assertEqual([b.type for b in final.content], ["thinking", "text"])
        self.assertEqual(final.content[1].text, m.content[1].text)
        # Thinking not asked for: no block is invented.
        m = ant().messages.create(model=MODEL, max_tokens=3, messages=msgs)
        self.assertEqual([b.type for b in m.content], ["text"])

    def test_d10_responses_delete_and_input_items(self):
        c = oai()
        r = c.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": "one"}, {"role": "user", "content": HARBOR}],
            max_output_tokens=2,
        )
        items = c.responses.input_items.list(r.id, order="asc")
        self.assertEqual([i.content[0].text for i in items.data], ["one", HARBOR])
        c.responses.delete(r.id)
        with self.assertRaises(openai.NotFoundError):
            c.responses.retrieve(r.id)


class Errors(unittest.TestCase):
    def test_wrong_key_is_refused_by_both_sdks(self):
        with self.assertRaises(openai.AuthenticationError):
            chat(oai("wrong-key"), HARBOR, 1)
        with self.assertRaises(anthropic.AuthenticationError):
            ant("wrong-key").messages.create(
                model=MODEL, max_tokens=1, messages=[{"role": "user", "content": HARBOR}]
            )

    def test_malformed_json_is_400_in_each_family_shape(self):
        for path, key in (("/v1/chat/completions", "error"), ("/v1/messages", "error")):
            req = urllib.request.Request(
                BASE + path,
                data=b'{"model": "x", "messages": [',
                headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY},
                method="POST",
            )
            with self.assertRaises(urllib.error.HTTPError) as cm:
                urllib.request.urlopen(req, timeout=30)
            self.assertEqual(cm.exception.code, 400)
            body = json.load(cm.exception)
            self.assertIn("message", body[key])
        # The SDK surfaces a bad parameter as a 400 naming it.
        with self.assertRaises(openai.BadRequestError) as cm:
            chat(oai(), HARBOR, 4, temperature=-1)
        self.assertIn("temperature", str(cm.exception))

    def test_context_overflow_names_the_numbers(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            oai().completions.create(model=MODEL, prompt=[100] * 5000, max_tokens=1)
        self.assertIn("5000", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
