/**
 * Engram's memory as AI SDK tools (`engram-ledger/ai`): save, search, and forget in two calls,
 * for one user. Each tool answers the model with plain JSON, and a refusal as
 * `{ error: { code, message } }` the model can read and act on, as Engram's MCP tools do.
 */
import { tool, type Tool } from "ai";
import { z } from "zod";

import type { Engram } from "./client.js";
import { EngramError } from "./errors.js";
import type { ErrorCode, ForgetReply } from "./types.js";

export interface EngramToolsOptions {
  /** The user the tools act for: needed with an operator's or a gateway's token only. */
  user?: string;
  /** What `searchMemories` answers at most when the model does not say (5). */
  topK?: number;
}

export interface SaveMemoryInput {
  content: string;
  category?: string | undefined;
  subject?: string | undefined;
}

export interface SearchMemoriesInput {
  query: string;
  top_k?: number | undefined;
  category?: string | undefined;
}

export interface ForgetMemoryInput {
  note_id?: string | undefined;
  note_ids?: string[] | undefined;
  query?: string | undefined;
}

export type Refused = { error: { code: ErrorCode; message: string } };

export type SaveMemoryOutput =
  | { note_id: string; version: number; similar: { note_id: string; content: string; similarity: number }[] }
  | Refused;

export type SearchMemoriesOutput =
  | {
      results: {
        note_id: string;
        content: string;
        relevance: number;
        category: string | null;
        subject: string | null;
        updated_at: string | null;
      }[];
    }
  | Refused;

export interface ForgetAnswer {
  status: ForgetReply["status"];
  message: string;
  candidates?: { note_id: string; content: string; similarity: number }[];
  pending?: { note_id: string; content_preview: string; expires_at: string }[];
  deleted?: string[];
}

export type ForgetMemoryOutput = ForgetAnswer | Refused;

// A type, not an interface: the AI SDK's ToolSet takes only what has an index signature.
export type EngramTools = {
  saveMemory: Tool<SaveMemoryInput, SaveMemoryOutput>;
  searchMemories: Tool<SearchMemoriesInput, SearchMemoriesOutput>;
  forgetMemory: Tool<ForgetMemoryInput, ForgetMemoryOutput>;
};

const SAVE = `Save one thing worth remembering about the user for later conversations: a fact, a \
preference, a plan. Write it as a short, self-contained sentence ("Alice's sister Sarah lives in \
Lisbon"). The answer gives the new memory's note_id, and in similar the memories close to it, which \
it may repeat or contradict.`;

const SEARCH = `Search what you remember about the user. Use it before answering anything that may \
depend on the user's facts, preferences or history. Each result has a note_id, the memory's content \
and its relevance (0-1); an empty list means nothing relevant is remembered.`;

const FORGET = `Delete memories, in two calls. First call with note_id (or note_ids): the deletion is \
requested and the answer asks you to confirm; show the user what will be deleted and get their \
agreement. Second call with the same note_id: it is deleted for good. Pending requests expire after \
5 minutes. Or call with query (and no note_id) to find candidates; that deletes nothing.`;

/** The AI SDK tools for one user's memory, to pass as `tools` to `generateText` or `streamText`. */
export function engramTools(client: Engram, options: EngramToolsOptions = {}): EngramTools {
  const user = options.user === undefined ? {} : { user: options.user };
  return {
    saveMemory: tool({
      description: SAVE,
      inputSchema: z.object({
        content: z.string().min(1).describe("The memory, one self-contained sentence"),
        category: z.string().optional().describe("A lower-case slug such as person, preference, project"),
        subject: z.string().optional().describe("Who or what it is about, e.g. Sarah"),
      }),
      execute: ({ content, category, subject }) =>
        answered(async () => {
          const saved = await client.save(content, { category, subject, ...user });
          const similar = saved.similar.map((s) => ({
            note_id: s.note_id,
            content: s.content,
            similarity: round(s.similarity),
          }));
          return { note_id: saved.note_id, version: saved.version, similar };
        }),
    }),
    searchMemories: tool({
      description: SEARCH,
      inputSchema: z.object({
        query: z.string().min(1).describe("What to look for, in words"),
        top_k: z.number().int().min(1).max(20).optional().describe("How many results at most"),
        category: z.string().optional().describe("Only memories of this category"),
      }),
      execute: ({ query, top_k, category }) =>
        answered(async () => {
          const found = await client.search(query, { top_k: top_k ?? options.topK ?? 5, category, ...user });
          const results = found.results.map((hit) => ({
            note_id: hit.note_id,
            content: hit.content,
            relevance: round(hit.relevance ?? 0),
            category: hit.note?.category ?? null,
            subject: hit.note?.subject ?? null,
            updated_at: hit.note?.updated_at ?? null,
          }));
          return { results };
        }),
    }),
    forgetMemory: tool({
      description: FORGET,
      inputSchema: z.object({
        note_id: z.string().optional().describe("The memory to delete (request it twice)"),
        note_ids: z.array(z.string()).optional().describe("Several memories at once"),
        query: z.string().optional().describe("Find candidates to delete (deletes nothing)"),
      }),
      execute: ({ note_id, note_ids, query }) =>
        answered(async () => {
          const ids = [...new Set([...(note_ids ?? []), ...(note_id ? [note_id] : [])])];
          if (ids.length === 0 && !query) {
            throw new EngramError("INVALID_PARAMETER", "give note_id to delete, or query to find candidates");
          }
          const reply = await client.forget(ids.length > 0 ? { note_ids: ids } : { query: query ?? "" }, user);
          return forgetAnswer(reply);
        }),
    }),
  };
}

/** The model's view of a forget reply, as the MCP tools give it. */
function forgetAnswer(reply: ForgetReply): ForgetAnswer {
  const out: ForgetAnswer = { status: reply.status, message: reply.message };
  if (reply.status === "candidates") {
    out.candidates = reply.candidates.map((c) => ({
      note_id: c.note_id,
      content: c.preview,
      similarity: round(c.similarity),
    }));
  }
  if (reply.pending.length) {
    out.pending = reply.pending.map((p) => ({
      note_id: p.note_id,
      content_preview: p.preview,
      expires_at: p.expires_at,
    }));
  }
  if (reply.forgotten.length) out.deleted = reply.forgotten;
  return out;
}

/** A refusal becomes an answer the model reads; anything else is the application's to handle. */
async function answered<O>(work: () => Promise<O>): Promise<O | Refused> {
  try {
    return await work();
  } catch (error) {
    if (error instanceof EngramError) return { error: { code: error.code, message: error.message } };
    throw error;
  }
}

function round(value: number): number {
  return Math.round(value * 10_000) / 10_000;
}
