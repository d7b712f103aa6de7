/**
 * Sending again: a write whose answer was lost is sent again under the same Idempotency-Key and
 * applied once (checked on the real service); the service's Retry-After is honoured; bounded
 * attempts; refusals and the caller's abort are not retried.
 */
import assert from "node:assert/strict";
import { test } from "node:test";

import { Engram, isEngramError, type Fetch } from "engram-ledger";

import { engramApi } from "./service.js";
import { recording, someone } from "./support.js";

/** `real`, except that the first POST of `path` is sent, answered, and then its answer lost by `lose`. */
function losingFirstAnswer(path: string, lose: (answer: Response, signal?: AbortSignal | null) => Promise<Response>): Fetch {
  let lost = false;
  return async (input, init) => {
    const answer = await fetch(input, init);
    if (lost || init?.method !== "POST" || new URL(String(input)).pathname !== path) return answer;
    lost = true;
    return lose(answer, init.signal);
  };
}

async function writtenOnce(lose: Parameters<typeof losingFirstAnswer>[1], timeoutMs = 30_000): Promise<void> {
  const api = await engramApi();
  const { fetch, sent } = recording(losingFirstAnswer("/v1/notes", lose));
  const engram = new Engram({ baseUrl: api.baseUrl, token: api.operatorToken, user: someone("retry"), fetch, timeoutMs });
  const saved = await engram.save("The ferry leaves at 7:40", { advise: false });

  const posts = sent.filter((s) => s.method === "POST" && s.path === "/v1/notes");
  assert.equal(posts.length, 2, "sent again once");
  const key = posts[0]?.headers.get("Idempotency-Key");
  assert.ok(key);
  assert.equal(posts[1]?.headers.get("Idempotency-Key"), key, "under the same key");
  assert.equal(saved.replayed, true, "the second send answers the first outcome");
  const history = await engram.history(saved.note_id);
  assert.deepEqual(
    history.versions.map((v) => [v.version, v.command_id]),
    [[1, key]],
    "applied once",
  );
  assert.equal((await engram.list()).total, 1);
}

test("a write whose answer is lost to the client's timeout is sent again and applied once", async () => {
  // The service has applied it; the answer then never comes, and the attempt's timeout ends it.
  await writtenOnce((_answer, signal) => hang(signal), 1_000);
});

test("a write whose connection breaks after it was applied is sent again and applied once", async () => {
  await writtenOnce(async () => {
    throw new TypeError("fetch failed: socket hang up");
  });
});

test("a write answered 504 TIMEOUT is sent again under its key", async () => {
  await writtenOnce(async () => {
    const body = { error: { type: "error", schema_version: 1, code: "TIMEOUT", message: "no reply in time" } };
    return Response.json(body, { status: 504 });
  });
});

/** Never answers: rejects when the attempt is aborted (by its timeout, or by the caller). */
function hang(signal?: AbortSignal | null): Promise<Response> {
  return new Promise((_, reject) => {
    if (signal?.aborted) reject(signal.reason);
    signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
  });
}

function answering(...answers: (() => Response)[]): { fetch: Fetch; calls: () => number } {
  let calls = 0;
  const fetch: Fetch = async () => {
    const next = answers[Math.min(calls, answers.length - 1)];
    calls++;
    assert.ok(next);
    return next();
  };
  return { fetch, calls: () => calls };
}

const offline = { baseUrl: "http://127.0.0.1:9", token: "t" };
const ok = () => Response.json({ type: "notes", notes: [], total: 0 });
const refusal = (status: number, code: string, headers: Record<string, string> = {}, retry_after_ms?: number) => () =>
  Response.json({ error: { type: "error", code, message: `${code} here`, retry_after_ms } }, { status, headers });

test("429 and 503 are sent again after the wait the service asks for", async () => {
  const { fetch, calls } = answering(refusal(429, "RATE_LIMITED", { "Retry-After": "1" }), ok);
  const started = Date.now();
  const listed = await new Engram({ ...offline, fetch }).list();
  assert.equal(listed.total, 0);
  assert.equal(calls(), 2);
  assert.ok(Date.now() - started >= 950, `waited ${Date.now() - started} ms of Retry-After: 1`);

  const starting = answering(refusal(503, "STARTING", { "Retry-After": "1" }, 20), ok);
  const quick = Date.now();
  await new Engram({ ...offline, fetch: starting.fetch }).list();
  assert.equal(starting.calls(), 2);
  assert.ok(Date.now() - quick < 900, "retry_after_ms, when given, is the finer wait");
});

test("sending again is bounded: the last answer's error, or TIMEOUT with the write's key", async () => {
  const busy = answering(refusal(503, "UNAVAILABLE", {}, 1));
  const refused = await new Engram({ ...offline, fetch: busy.fetch, retries: 2 }).list().catch((e: unknown) => e);
  assert.ok(isEngramError(refused, "UNAVAILABLE"));
  assert.equal(busy.calls(), 3);

  let sends = 0;
  const silent: Fetch = (_input, init) => {
    sends++;
    return hang(init?.signal);
  };
  const engram = new Engram({ ...offline, fetch: silent, retries: 1, timeoutMs: 50 });
  const timedOut = await engram.save("x", { idempotencyKey: "my-key-1" }).catch((e: unknown) => e);
  assert.ok(isEngramError(timedOut, "TIMEOUT"), String(timedOut));
  assert.equal(timedOut.status, undefined);
  assert.equal(timedOut.idempotencyKey, "my-key-1", "send it again later under this key");
  assert.equal(sends, 2);
});

test("refusals and the caller's abort are not sent again", async () => {
  for (const [status, code] of [
    [400, "INVALID_PARAMETER"],
    [409, "VERSION_CONFLICT"],
    [500, "STORAGE_ERROR"],
  ] as const) {
    const once = answering(refusal(status, code));
    const error = await new Engram({ ...offline, fetch: once.fetch }).list().catch((e: unknown) => e);
    assert.ok(isEngramError(error, code));
    assert.equal(once.calls(), 1, `${status} is not sent again`);
  }
  const stop = new AbortController();
  let sends = 0;
  const hanging: Fetch = (_input, init) => {
    sends++;
    stop.abort(new Error("the caller gave up"));
    return hang(init?.signal);
  };
  const aborted = await new Engram({ ...offline, fetch: hanging }).list({ signal: stop.signal }).catch((e: unknown) => e);
  assert.ok(aborted instanceof Error && aborted.message === "the caller gave up", String(aborted));
  assert.equal(sends, 1);
});

test("an answer that is not Engram's keeps a code from its status", async () => {
  const proxy = answering(() => new Response("<html>Bad gateway</html>", { status: 502 }));
  const error = await new Engram({ ...offline, fetch: proxy.fetch }).list().catch((e: unknown) => e);
  assert.ok(isEngramError(error, "UNAVAILABLE"));
  assert.equal(error.status, 502);
  assert.match(error.message, /Bad gateway/);
});
