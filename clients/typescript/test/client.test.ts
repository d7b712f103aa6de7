/** The client against a real `engram serve` and `engram http`: each resource's calls and their errors. */
import assert from "node:assert/strict";
import { test } from "node:test";

import { Engram, EngramError, isEngramError, type Fetch } from "engram-ledger";

import { engramApi } from "./service.js";
import { clientOf, operatorClient, recording, someone } from "./support.js";

test("a save is read back, and the next search sees it without being told (read-your-writes)", async () => {
  const { fetch, sent } = recording();
  const { engram } = await clientOf(someone("alice"), { fetch });
  const saved = await engram.save("Alice's sister Sarah lives in Lisbon", { category: "person", subject: "Sarah" });
  assert.equal(saved.version, 1);
  assert.equal(engram.lastToken(), saved.token);

  const found = await engram.search("where does Sarah live?", { min_relevance: 0 });
  assert.deepEqual(
    found.results.map((hit) => hit.note_id),
    [saved.note_id],
  );
  const search = sent.find((s) => s.path === "/v1/search");
  assert.equal(search?.headers.get("Engram-Read-After"), saved.token, "the search waited for the save");
  const note = await engram.get(saved.note_id);
  assert.equal(note.content, "Alice's sister Sarah lives in Lisbon");
  assert.equal(note.subject, "Sarah");
});

test("read-your-writes can be turned off, for the client or for one read", async () => {
  const { fetch, sent } = recording();
  const api = await engramApi();
  const engram = await operatorClient({ user: someone("alice"), fetch, readYourWrites: false });
  const saved = await engram.save("The ferry leaves at 7:40");
  await engram.list({ after: saved.token });
  await engram.list();
  const reads = sent.filter((s) => s.path.startsWith("/v1/notes") && s.method === "GET");
  assert.deepEqual(
    reads.map((r) => r.headers.get("Engram-Read-After")),
    [saved.token, null],
  );
  const tracking = new Engram({ baseUrl: api.baseUrl, token: api.operatorToken, user: someone("bob"), fetch });
  await tracking.save("Bob keeps bees");
  await tracking.list({ after: null });
  assert.equal(sent.at(-1)?.headers.get("Engram-Read-After"), null, "after: null waits for nothing");
});

test("writes answered out of order leave reads waiting for the newer one", async () => {
  // The first save is applied, and its answer held back until the second's has come.
  let firstApplied: () => void = () => undefined;
  let secondAnswered: () => void = () => undefined;
  const applied = new Promise<void>((resolve) => (firstApplied = resolve));
  const answered = new Promise<void>((resolve) => (secondAnswered = resolve));
  let saves = 0;
  const holding: Fetch = async (input, init) => {
    const answer = await fetch(input, init);
    if (init?.method !== "POST") return answer;
    if (++saves === 1) {
      firstApplied();
      await answered;
    } else {
      secondAnswered();
    }
    return answer;
  };
  const engram = await operatorClient({ user: someone("olga"), fetch: holding });
  const first = engram.save("First", { advise: false });
  await applied;
  const second = await engram.save("Second", { advise: false });
  await first;
  assert.equal(engram.lastToken(), second.token, "the newer write's token, though it was answered first");
});

test("a listing pages, and reads the memory as it was after a write", async () => {
  const engram = await operatorClient({ user: someone("carol") });
  const batch = await engram.saveMany([1, 2, 3].map((i) => ({ content: `Fact number ${i}` })));
  assert.equal(batch.notes.length, 3);
  await engram.save("A later fact", { advise: false });
  const now = await engram.list({ limit: 2 });
  assert.equal(now.total, 4);
  assert.equal(now.notes.length, 2);
  const then = await engram.list({ as_of: batch.token });
  assert.equal(then.total, 3, "as_of a write's token: the listing right after it");
});

test("a stale expected_version is refused with VERSION_CONFLICT; history, revert and diff", async () => {
  const engram = await operatorClient({ user: someone("dave") });
  const saved = await engram.save("Alec is my boss", { advise: false });
  const changed = await engram.update(saved.note_id, { content: "Alec was my boss", expected_version: 1 });
  assert.equal(changed.version, 2);
  const stale = await engram.update(saved.note_id, { content: "again", expected_version: 1 }).catch((e: unknown) => e);
  assert.ok(isEngramError(stale, "VERSION_CONFLICT"), String(stale));
  assert.equal(stale.status, 409);
  assert.ok(stale.idempotencyKey, "a refused write names its key");

  const history = await engram.history(saved.note_id);
  assert.deepEqual(
    history.versions.map((v) => v.version),
    [1, 2],
  );
  const reverted = await engram.revert(saved.note_id, 1);
  assert.equal(reverted.version, 3);
  assert.equal((await engram.get(saved.note_id)).content, "Alec is my boss");
  const diff = await engram.diff({ since: saved.token });
  assert.deepEqual(
    diff.changes.map((c) => c.change),
    ["updated", "reverted"],
  );
  const past = await engram.get(saved.note_id, { as_of: changed.token });
  assert.equal(past.content, "Alec was my boss");
});

test("search keeps to min_relevance; supersede leaves search; the memory block", async () => {
  const engram = await operatorClient({ user: someone("erin") });
  const boss = await engram.save("Alec is my boss at TechCorp", { advise: false });
  await engram.save("I water the plants on Sundays", { advise: false });
  const strict = await engram.search("who is my manager?", { min_relevance: 0.99 });
  assert.deepEqual(strict.results, [], "nothing is that relevant");
  const loose = await engram.search("who is my manager?", { min_relevance: 0.3 });
  assert.equal(loose.results[0]?.note_id, boss.note_id);
  const block = await engram.context({ query: "my manager" });
  assert.match(block.text, /Alec is my boss at TechCorp/);

  const newer = await engram.save("Dana is my boss at TechCorp", { advise: false });
  await engram.supersede(boss.note_id, newer.note_id);
  const after = await engram.search("who is my manager?", { min_relevance: 0 });
  assert.ok(!after.results.some((hit) => hit.note_id === boss.note_id), "a superseded note leaves search");
});

test("conversations, and values under keys", async () => {
  const engram = await operatorClient({ user: someone("frank") });
  const turns = [
    { role: "user", content: "I moved to Lisbon" },
    { role: "assistant", content: "Noted!" },
  ];
  const recorded = await engram.recordMessages("chat-1", turns);
  assert.equal(recorded.notes.length, 2);
  const listed = await engram.messages("chat-1");
  assert.deepEqual(
    listed.messages.map((m) => m.content),
    ["I moved to Lisbon", "Noted!"],
  );

  await engram.putKey("ui/theme", { theme: "dark" }, { category: "settings" });
  const put = await engram.putKey("ui/theme", { theme: "light" }, { category: "settings" });
  assert.equal(put.version, 2, "a second put is a new version of the same note");
  const got = await engram.getKey("ui/theme", { category: "settings" });
  assert.deepEqual(got?.value, { theme: "light" });
  assert.equal(await engram.getKey("nothing", { category: "settings" }), null);
});

test("forgetting takes two calls: candidates, a confirmation, then gone", async () => {
  const engram = await operatorClient({ user: someone("grace") });
  const saved = await engram.save("My locker code is 1234", { advise: false });
  const candidates = await engram.forget({ query: "locker code" });
  assert.equal(candidates.status, "candidates");
  assert.equal(candidates.candidates?.[0]?.note_id, saved.note_id);
  assert.equal((await engram.get(saved.note_id)).status, "active", "a query deletes nothing");

  const asked = await engram.forget(saved.note_id);
  assert.equal(asked.status, "confirmation_required");
  assert.deepEqual(
    asked.pending?.map((p) => p.note_id),
    [saved.note_id],
  );
  assert.equal((await engram.get(saved.note_id)).status, "active", "the first call deletes nothing");
  const done = await engram.confirmForget(asked);
  assert.equal(done.status, "forgotten");
  assert.deepEqual(done.forgotten, [saved.note_id]);
  assert.equal((await engram.get(saved.note_id)).status, "forgotten");
  const nothing = await engram.confirmForget(done).catch((e: unknown) => e);
  assert.ok(isEngramError(nothing, "INVALID_PARAMETER"), String(nothing));
});

test("an operator's token names the user, and erases a conversation and a user in two calls", async () => {
  const user = someone("heidi");
  const operator = await operatorClient({ user });
  await operator.save("Heidi likes tea", { advise: false });
  await operator.recordMessages("chat-9", [{ content: "hello" }]);
  const asked = await operator.eraseConversation(user, "chat-9");
  assert.equal(asked.status, "confirmation_required");
  assert.equal((await operator.eraseConversation(user, "chat-9")).status, "forgotten");
  assert.equal((await operator.eraseUser(user)).status, "confirmation_required");
  const erased = await operator.eraseUser(user);
  assert.equal(erased.status, "forgotten");
  assert.ok(erased.erased_at);
  assert.equal((await operator.list()).total, 0, "read after the erasure: nothing left");

  const unnamed = await (await operatorClient()).list().catch((e: unknown) => e);
  assert.ok(isEngramError(unnamed, "INVALID_PARAMETER"));
  assert.match(unnamed.message, /X-Engram-User/);
});

test("a bad token is refused 401 with PERMISSION_DENIED, once", async () => {
  const api = await engramApi();
  const { fetch, sent } = recording();
  const engram = new Engram({ baseUrl: `${api.baseUrl}/v1`, token: "engram_not-a-token", fetch });
  const refused = await engram.save("anything").catch((e: unknown) => e);
  assert.ok(refused instanceof EngramError);
  assert.equal(refused.code, "PERMISSION_DENIED");
  assert.equal(refused.status, 401);
  assert.match(refused.message, /bearer token/);
  assert.equal(sent.length, 1, "a refusal is not sent again");
});

test("a refused request says why in the contract's words", async () => {
  const engram = await operatorClient({ user: someone("ivan") });
  const blank = await engram.save("   ").catch((e: unknown) => e);
  assert.ok(isEngramError(blank, "INVALID_PARAMETER"));
  assert.equal(blank.status, 400);
  assert.match(blank.message, /content/);
  const missing = await engram.get("AAAAAAAA").catch((e: unknown) => e);
  assert.ok(isEngramError(missing, "MEMORY_NOT_FOUND"));
  assert.equal(missing.status, 404);
});
