/**
 * `Engram`: the HTTP API's routes as typed calls, over openapi-fetch and the types generated
 * from the OpenAPI document. Fields are the contract's own (snake_case, as the API and the Python
 * client name them); what a call adds (the user, an idempotency key, a write to wait for, an
 * abort signal) is camelCase beside them.
 */
import createClient from "openapi-fetch";
import type { Client } from "openapi-fetch";

import { EngramError, errorOfAnswer } from "./errors.js";
import { followEvents, type EventsOptions } from "./events.js";
import { ReadYourWrites } from "./read-your-writes.js";
import type { paths } from "./schema.js";
import { sendingAgain, type Fetch } from "./transport.js";
import type * as T from "./types.js";

export interface EngramOptions {
  /** Where `engram http` listens, e.g. `http://127.0.0.1:8788` (a trailing `/v1` is fine too). */
  baseUrl: string;
  /** A token of `engram tokens create`. */
  token: string;
  /** The user every call acts as, for an operator's token or a gateway's secret (`X-Engram-User`). */
  user?: string;
  /** The fetch to send with (tests, proxies, instrumentation); the runtime's by default. */
  fetch?: Fetch;
  /** The longest one attempt may take, in ms (30 s by default). */
  timeoutMs?: number;
  /** How many times a call is sent again after a timeout, a lost connection, 429, 503 or 504 (3). */
  retries?: number;
  /** Each read waits for this client's last write of its user (true by default). */
  readYourWrites?: boolean;
  /** More headers for every request. */
  headers?: Record<string, string>;
}

export interface CallOptions {
  /** The user this call acts as (an operator's or a gateway's token only). */
  user?: string;
  signal?: AbortSignal;
}

export interface WriteOptions extends CallOptions {
  /** The write's command id: sent again under the same key, it is applied once. A fresh UUID by default. */
  idempotencyKey?: string;
}

export interface ReadOptions extends CallOptions {
  /**
   * A write's token (`reply.token`) this read must see. By default the client's last write of
   * this user (read-your-writes); null: wait for none.
   */
  after?: string | null;
}

/** What `forget` takes: a note id, several, or the contract's request (`query` finds candidates). */
export type ForgetTarget = string | string[] | T.ForgetRequest;

type Answer<D> = { data?: D; error?: unknown; response: Response };
type Sent = { headers: Record<string, string>; signal?: AbortSignal };
// A read waits for the user's last write; a write carries an Idempotency-Key and its token is
// remembered; a forget does both (its candidates include what was just saved).
type Kind = "read" | "write" | "forget";

const LOCAL_OPTIONS = ["user", "signal", "idempotencyKey", "after"] as const;

export class Engram {
  readonly baseUrl: string;
  private readonly api: Client<paths>;
  private readonly user: string | undefined;
  private readonly fetchFn: Fetch;
  private readonly timeoutMs: number;
  private readonly retries: number;
  private readonly headers: Record<string, string>;
  private readonly tokens: ReadYourWrites;

  constructor(options: EngramOptions) {
    this.baseUrl = new URL(options.baseUrl).href.replace(/\/+$/, "").replace(/\/v1$/, "");
    this.user = options.user;
    this.fetchFn = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.retries = options.retries ?? 3;
    this.headers = { ...options.headers, Authorization: `Bearer ${options.token}` };
    this.tokens = new ReadYourWrites(options.readYourWrites ?? true);
    this.api = createClient<paths>({
      baseUrl: this.baseUrl,
      headers: this.headers,
      fetch: sendingAgain(this.fetchFn, { retries: this.retries, timeoutMs: this.timeoutMs }),
    });
  }

  /** The token of this client's last write for `user` (the token's own user by default). */
  lastToken(user?: string): string | undefined {
    return this.tokens.last(user ?? this.user);
  }

  // Notes

  /** Save a note; `reply.similar` and `action_required` say when it may repeat or outdate another. */
  save(content: string, fields: Omit<T.SaveNoteRequest, "content"> & WriteOptions = {}): Promise<T.NoteWritten> {
    const [body, options] = split(fields);
    return this.send("write", options, (sent) => this.api.POST("/v1/notes", { ...sent, body: { ...body, content } }));
  }

  /** Save several notes at once, applied together. */
  saveMany(notes: T.NoteDraft[], fields: Omit<T.SaveNotesRequest, "notes"> & WriteOptions = {}): Promise<T.NotesWritten> {
    const [body, options] = split(fields);
    return this.send("write", options, (sent) =>
      this.api.POST("/v1/notes/batch", { ...sent, body: { ...body, notes } }),
    );
  }

  /** A note (`as_of`: as it was at a time, or right after a write's token). */
  async get(noteId: string, query: T.GetNoteQuery & ReadOptions = {}): Promise<T.NoteView> {
    const [params, options] = split(query);
    const reply = await this.send("read", options, (sent) =>
      this.api.GET("/v1/notes/{note_id}", { ...sent, params: { path: { note_id: noteId }, query: params } }),
    );
    return reply.note;
  }

  /** A page of the memory, newest first; superseded notes only with `include_superseded`. */
  list(query: T.ListNotesQuery & ReadOptions = {}): Promise<T.NotesReply> {
    const [params, options] = split(query);
    return this.send("read", options, (sent) => this.api.GET("/v1/notes", { ...sent, params: { query: params } }));
  }

  /** A new version of a note; with `expected_version`, refused (`VERSION_CONFLICT`) if it is stale. */
  update(noteId: string, fields: T.UpdateNoteRequest & WriteOptions): Promise<T.NoteWritten> {
    const [body, options] = split(fields);
    return this.send("write", options, (sent) =>
      this.api.PATCH("/v1/notes/{note_id}", { ...sent, params: { path: { note_id: noteId } }, body }),
    );
  }

  /** Mark a note replaced by another: it leaves searches and listings, and keeps its history. */
  supersede(
    noteId: string,
    supersededBy: string,
    fields: Omit<T.SupersedeNoteRequest, "superseded_by"> & WriteOptions = {},
  ): Promise<T.NoteWritten> {
    const [body, options] = split(fields);
    return this.send("write", options, (sent) =>
      this.api.POST("/v1/notes/{note_id}/supersede", {
        ...sent,
        params: { path: { note_id: noteId } },
        body: { ...body, superseded_by: supersededBy },
      }),
    );
  }

  /** A new version with what the note said at `toVersion`. */
  revert(
    noteId: string,
    toVersion: number,
    fields: Omit<T.RevertNoteRequest, "to_version"> & WriteOptions = {},
  ): Promise<T.NoteWritten> {
    const [body, options] = split(fields);
    return this.send("write", options, (sent) =>
      this.api.POST("/v1/notes/{note_id}/revert", {
        ...sent,
        params: { path: { note_id: noteId } },
        body: { ...body, to_version: toVersion },
      }),
    );
  }

  /** Every version of a note, with its time and the change that made it. */
  history(noteId: string, options: ReadOptions = {}): Promise<T.HistoryReply> {
    return this.send("read", options, (sent) =>
      this.api.GET("/v1/notes/{note_id}/history", { ...sent, params: { path: { note_id: noteId } } }),
    );
  }

  /** What changed between two moments (times, or write tokens). */
  diff(query: T.DiffQuery & ReadOptions): Promise<T.DiffReply> {
    const [params, options] = split(query);
    return this.send("read", options, (sent) => this.api.GET("/v1/diff", { ...sent, params: { query: params } }));
  }

  // Search and prompts

  /** Notes relevant to `query`, best first, each with its `relevance` (0-1). */
  search(query: string, fields: Omit<T.SearchNotesRequest, "query"> & ReadOptions = {}): Promise<T.SearchReply> {
    const [body, options] = split(fields);
    return this.send("read", options, (sent) => this.api.POST("/v1/search", { ...sent, body: { ...body, query } }));
  }

  /** The memory block for a system prompt (`text`), focused on `query` if given. */
  context(fields: T.BuildContextRequest & ReadOptions = {}): Promise<T.ContextReply> {
    const [body, options] = split(fields);
    return this.send("read", options, (sent) => this.api.POST("/v1/context", { ...sent, body }));
  }

  // Conversations

  /** Record turns of a conversation; the reply's `notes` are the new messages' ids, in order. */
  recordMessages(
    sessionId: string,
    messages: T.MessageDraft[],
    fields: Omit<T.RecordMessagesRequest, "messages"> & WriteOptions = {},
  ): Promise<T.NotesWritten> {
    const [body, options] = split(fields);
    return this.send("write", options, (sent) =>
      this.api.POST("/v1/conversations/{session_id}/messages", {
        ...sent,
        params: { path: { session_id: sessionId } },
        body: { ...body, messages },
      }),
    );
  }

  /** A conversation's turns, in order. */
  messages(sessionId: string, query: T.ListMessagesQuery & ReadOptions = {}): Promise<T.MessagesReply> {
    const [params, options] = split(query);
    return this.send("read", options, (sent) =>
      this.api.GET("/v1/conversations/{session_id}/messages", {
        ...sent,
        params: { path: { session_id: sessionId }, query: params },
      }),
    );
  }

  // Keys and values

  /** Put `value` under `key` (in `category`): a note the first time, a new version after. */
  putKey(
    key: string,
    value: Record<string, unknown>,
    fields: Omit<T.PutKeyRequest, "value"> & WriteOptions = {},
  ): Promise<T.NoteWritten> {
    const [body, options] = split(fields);
    return this.send("write", options, (sent) =>
      this.api.PUT("/v1/keys/{key}", { ...sent, params: { path: { key } }, body: { ...body, value } }),
    );
  }

  /** The note put under `key` in `category` (`general` by default, as `putKey`), or null when there is none. */
  async getKey(key: string, query: T.GetKeyQuery & ReadOptions = {}): Promise<T.NoteView | null> {
    const [params, options] = split(query);
    try {
      const reply = await this.send("read", options, (sent) =>
        this.api.GET("/v1/keys/{key}", { ...sent, params: { path: { key }, query: params } }),
      );
      return reply.note;
    } catch (error) {
      if (error instanceof EngramError && error.code === "MEMORY_NOT_FOUND") return null;
      throw error;
    }
  }

  // Forgetting, in two calls

  /**
   * Forget in two calls. With ids: the first call answers `confirmation_required` (relay
   * `reply.message` and get the user's agreement); the same ids again (or `confirmForget(reply)`)
   * within five minutes forget them for good: `forgotten`. With `{ query }`: `candidates`, and
   * nothing is deleted.
   */
  forget(target: ForgetTarget, options: WriteOptions & Pick<ReadOptions, "after"> = {}): Promise<T.ForgetReply> {
    const body: T.ForgetRequest =
      typeof target === "string" ? { note_ids: [target] } : Array.isArray(target) ? { note_ids: target } : target;
    return this.send("forget", options, (sent) => this.api.POST("/v1/forget", { ...sent, body }));
  }

  /** The second call of a forget: the notes `reply` left pending are forgotten. */
  confirmForget(reply: T.ForgetReply, options: WriteOptions = {}): Promise<T.ForgetReply> {
    const pending = reply.pending.map((p) => p.note_id);
    if (reply.status !== "confirmation_required" || pending.length === 0) {
      const why = `this reply (${reply.status}) leaves nothing pending to confirm`;
      return Promise.reject(new EngramError("INVALID_PARAMETER", why));
    }
    return this.forget(pending, options);
  }

  /** Operators: erase all of `user`'s memory, in the same two calls (the second erases). */
  eraseUser(user: string, options: Omit<WriteOptions, "user"> = {}): Promise<T.ForgetReply> {
    return this.send("write", { ...options, user }, (sent) =>
      this.api.DELETE("/v1/users/{user_id}", { ...sent, params: { path: { user_id: user } } }),
    );
  }

  /** Operators: erase one conversation of `user`, in the same two calls. */
  eraseConversation(user: string, sessionId: string, options: Omit<WriteOptions, "user"> = {}): Promise<T.ForgetReply> {
    return this.send("write", { ...options, user }, (sent) =>
      this.api.DELETE("/v1/users/{user_id}/conversations/{session_id}", {
        ...sent,
        params: { path: { user_id: user, session_id: sessionId } },
      }),
    );
  }

  // Events

  /**
   * The user's memory events as they are appended (ids, type, times; never content), for
   * `for await`. A dropped connection is resumed after the last event given out; `lastEventId`
   * starts after an earlier one (else at the log's end); `signal` or `break` ends it.
   */
  events(options: EventsOptions = {}): AsyncGenerator<T.LogEvent> {
    const headers = new Headers(this.headers);
    const user = options.user ?? this.user;
    if (user) headers.set("X-Engram-User", user);
    const url = `${this.baseUrl}/v1/events`;
    return followEvents({ fetch: this.fetchFn, url, headers, retries: this.retries, timeoutMs: this.timeoutMs }, options);
  }

  /**
   * One call: the headers it adds (the user, the write's idempotency key, the write to wait
   * for), its answer or its error, and the token of a write remembered for the next reads.
   */
  private async send<D>(
    kind: Kind,
    options: WriteOptions & ReadOptions,
    call: (sent: Sent) => Promise<Answer<D>>,
  ): Promise<D> {
    const user = options.user ?? this.user;
    const headers: Record<string, string> = {};
    if (user) headers["X-Engram-User"] = user;
    const key = kind === "read" ? undefined : (options.idempotencyKey ?? crypto.randomUUID());
    if (key) headers["Idempotency-Key"] = key;
    const after = kind === "write" ? undefined : this.tokens.after(user, options.after);
    if (after) headers["Engram-Read-After"] = after;
    let answer: Answer<D>;
    try {
      answer = await call({ headers, ...(options.signal ? { signal: options.signal } : {}) });
    } catch (error) {
      if (error instanceof EngramError) error.idempotencyKey = key;
      throw error;
    }
    if (!answer.response.ok || answer.data === undefined) {
      const error = errorOfAnswer(answer.response.status, answer.error, answer.response.headers);
      error.idempotencyKey = key;
      throw error;
    }
    if (kind !== "read") this.tokens.wrote(user, (answer.data as { token?: string | null }).token);
    return answer.data;
  }
}

/** The contract's fields apart from the call's own options. */
function split<F extends object>(fields: F): [Omit<F, (typeof LOCAL_OPTIONS)[number]>, WriteOptions & ReadOptions] {
  const body: Record<string, unknown> = {};
  const options: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(fields)) {
    if (value === undefined) continue;
    ((LOCAL_OPTIONS as readonly string[]).includes(name) ? options : body)[name] = value;
  }
  return [body as Omit<F, (typeof LOCAL_OPTIONS)[number]>, options as WriteOptions & ReadOptions];
}
