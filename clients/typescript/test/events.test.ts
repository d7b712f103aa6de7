/** The event stream over the real service: resuming after an id, and after a dropped connection. */
import assert from "node:assert/strict";
import { test } from "node:test";

import type { Engram, Fetch, LogEvent } from "engram-ledger";

import { operatorClient, recording, someone } from "./support.js";

/** The first `count` events of `stream`, then the stream closed. */
async function take(stream: AsyncGenerator<LogEvent>, count: number): Promise<LogEvent[]> {
  const had: LogEvent[] = [];
  for await (const event of stream) {
    had.push(event);
    if (had.length === count) break;
  }
  return had;
}

async function saved(engram: Engram, ...contents: string[]): Promise<string[]> {
  const ids: string[] = [];
  for (const content of contents) ids.push((await engram.save(content, { advise: false })).note_id);
  return ids;
}

test("events resume right after the Last-Event-ID given, each event once", async () => {
  const engram = await operatorClient({ user: someone("judy") });
  const first = await engram.save("First", { advise: false });
  const stream = engram.events({ lastEventId: first.token });
  const [second] = await saved(engram, "Second");
  const [seen] = await take(stream, 1);
  assert.equal(seen?.note_id, second, "the stream starts after the id it is given");
  assert.equal(seen?.type, "note_saved");

  // Away from the stream, two more writes; back with the last id had, exactly those two.
  const missed = await saved(engram, "Third", "Fourth");
  const resumed = await take(engram.events({ lastEventId: seen?.token }), 2);
  assert.deepEqual(
    resumed.map((e) => e.note_id),
    missed,
  );
});

/** A fetch whose first event stream is cut right after its first event. */
function cuttingFirstStream(): Fetch {
  let cut = false;
  return async (input, init) => {
    const answer = await fetch(input, init);
    if (cut || !answer.headers.get("content-type")?.startsWith("text/event-stream") || answer.body === null) {
      return answer;
    }
    cut = true;
    const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
    let text = "";
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const { done, value } = await reader.read();
        if (done) return controller.close();
        text += value;
        const end = /data:[^\r\n]*(\r\n|\r|\n)(\r\n|\r|\n)/.exec(text);
        if (end === null) return;
        // The first event goes through whole, and nothing after it: the connection drops.
        controller.enqueue(new TextEncoder().encode(text.slice(0, end.index + end[0].length)));
        await reader.cancel();
        controller.error(new TypeError("terminated"));
      },
      cancel: (reason) => reader.cancel(reason),
    });
    return new Response(body, { status: answer.status, headers: answer.headers });
  };
}

test("a dropped stream connects again with the last id and misses nothing", async () => {
  const { fetch, sent } = recording(cuttingFirstStream());
  const engram = await operatorClient({ user: someone("ken"), fetch });
  const start = await engram.save("Start", { advise: false });
  const stream = engram.events({ lastEventId: start.token });
  const written = await saved(engram, "One", "Two", "Three");
  const had = await take(stream, 3);
  assert.deepEqual(
    had.map((e) => e.note_id),
    written,
    "every event once, in order, across the drop",
  );
  const connections = sent.filter((s) => s.path === "/v1/events");
  assert.equal(connections.length, 2, "connected again once");
  assert.equal(connections[0]?.headers.get("Last-Event-ID"), start.token);
  assert.equal(connections[1]?.headers.get("Last-Event-ID"), had[0]?.token, "after the last event had");
});

test("breaking out of the loop, or aborting, ends the stream", async () => {
  const engram = await operatorClient({ user: someone("leo") });
  const start = await engram.save("Start", { advise: false });
  const stop = new AbortController();
  const stream = engram.events({ lastEventId: start.token, signal: stop.signal });
  const [one] = await saved(engram, "One");
  const next = await stream.next();
  assert.equal((next.value as LogEvent).note_id, one);
  stop.abort();
  const ended = await stream.next();
  assert.equal(ended.done, true, "an abort ends the iteration without an error");
});
