/**
 * The AI SDK tools in a real `generateText` loop, the model the AI SDK's mock (no network): it
 * saves a memory, searches for it, and forgets it in two calls, each step reading the last tool's
 * answer as a model would; then Engram's state is checked through the client.
 */
import assert from "node:assert/strict";
import { test } from "node:test";

import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { engramTools } from "engram-ledger/ai";

import { clientOf, operatorClient, someone } from "./support.js";

type Output = Record<string, any>;
type CallOptions = Parameters<MockLanguageModelV4["doGenerate"]>[0];
type Generated = Awaited<ReturnType<MockLanguageModelV4["doGenerate"]>>;

/** The tool answers so far in the prompt, oldest first. */
function toolOutputs(options: CallOptions): Output[] {
  return options.prompt.flatMap((message) =>
    message.role === "tool"
      ? message.content.flatMap((part) =>
          part.type === "tool-result" && part.output.type === "json" ? [part.output.value as Output] : [],
        )
      : [],
  );
}

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

function calling(step: number, toolName: string, input: object): Generated {
  return {
    content: [{ type: "tool-call", toolCallId: `call-${step}`, toolName, input: JSON.stringify(input) }],
    finishReason: { unified: "tool-calls", raw: undefined },
    usage,
    warnings: [],
  };
}

function saying(text: string): Generated {
  return { content: [{ type: "text", text }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
}

/** A model that remembers a fact, looks it up, then forgets what it found: the first call asks, the second deletes. */
function forgetfulModel(): MockLanguageModelV4 {
  return new MockLanguageModelV4({
    doGenerate: async (options) => {
      const outputs = toolOutputs(options);
      const found = outputs[1]?.results?.[0]?.note_id as string | undefined;
      switch (outputs.length) {
        case 0:
          return calling(0, "saveMemory", { content: "Alice's sister Sarah lives in Lisbon", subject: "Sarah" });
        case 1:
          return calling(1, "searchMemories", { query: "where does Sarah live?" });
        case 2:
          return calling(2, "forgetMemory", { note_id: found });
        case 3:
          assert.equal(outputs[2]?.status, "confirmation_required", JSON.stringify(outputs[2]));
          return calling(3, "forgetMemory", { note_id: found });
        default:
          return saying(`Done: ${outputs[3]?.status}`);
      }
    },
  });
}

test("a generateText loop saves, searches and forgets in two calls through the tools", async () => {
  const { engram } = await clientOf(someone("mallory"));
  const result = await generateText({
    model: forgetfulModel(),
    tools: engramTools(engram),
    prompt: "Remember that my sister Sarah lives in Lisbon, check it, then forget it.",
    stopWhen: stepCountIs(10),
  });

  assert.deepEqual(
    result.steps.flatMap((step) => step.toolCalls.map((call) => call.toolName)),
    ["saveMemory", "searchMemories", "forgetMemory", "forgetMemory"],
  );
  const [saved, found, asked, deleted] = result.steps.flatMap((step) => step.toolResults.map((r) => r.output as Output));
  assert.ok(saved?.note_id, JSON.stringify(saved));
  assert.equal(found?.results?.[0]?.note_id, saved.note_id, "the search saw the save (read-your-writes)");
  assert.equal(asked?.pending?.[0]?.note_id, saved.note_id);
  assert.deepEqual(deleted?.deleted, [saved.note_id]);
  assert.equal(result.text, "Done: forgotten");

  assert.equal((await engram.get(saved.note_id)).status, "forgotten");
  assert.deepEqual((await engram.search("Sarah Lisbon", { min_relevance: 0 })).results, []);
});

test("the tools act for the user they are given, and answer a refusal as data the model reads", async () => {
  const user = someone("niaj");
  const operator = await operatorClient();
  const tools = engramTools(operator, { user });
  const options = { toolCallId: "t", messages: [], context: {} };
  const saved = (await tools.saveMemory.execute?.({ content: "Niaj plays the cello" }, options)) as Output;
  assert.ok(saved.note_id);
  assert.equal((await operator.get(saved.note_id, { user })).content, "Niaj plays the cello");

  const refused = (await tools.forgetMemory.execute?.({ note_id: "AAAAAAAA" }, options)) as Output;
  assert.equal(refused.error?.code, "MEMORY_NOT_FOUND");
  const empty = (await tools.forgetMemory.execute?.({}, options)) as Output;
  assert.equal(empty.error?.code, "INVALID_PARAMETER");
});
