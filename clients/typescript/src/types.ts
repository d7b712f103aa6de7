/**
 * Names for the contracts of Engram's HTTP API, all taken from the types that `npm run generate`
 * writes from its OpenAPI document (`schema.ts`): none is written by hand here.
 */
import type { components, operations } from "./schema.js";

type Schemas = components["schemas"];

/** The contract's error codes (`ErrorReply.code`). */
export type ErrorCode = Schemas["ErrorCode"];
export type ErrorReply = Schemas["ErrorReply"];

export type NoteView = Schemas["NoteView"];
export type NoteKind = Schemas["NoteKind"];
export type NoteStatus = Schemas["NoteStatus"];
export type NoteDraft = Schemas["NoteDraft"];
export type MessageDraft = Schemas["MessageDraft"];
export type MessageView = Schemas["MessageView"];
export type Origin = Schemas["Origin"];

export type NoteWritten = Schemas["NoteWritten"];
export type NotesWritten = Schemas["NotesWritten"];
export type NotesReply = Schemas["NotesReply"];
export type HistoryReply = Schemas["HistoryReply"];
export type DiffReply = Schemas["DiffReply"];
export type SearchReply = Schemas["SearchReply"];
export type SearchHit = Schemas["SearchHit"];
export type ContextReply = Schemas["ContextReply"];
export type MessagesReply = Schemas["MessagesReply"];
export type ForgetReply = Schemas["ForgetReply"];

/** One event of `GET /v1/events`: ids, type, times and channel, never content. */
export type LogEvent = Schemas["LogEvent"];

export type SaveNoteRequest = Schemas["SaveNoteRequest"];
export type SaveNotesRequest = Schemas["SaveNotesRequest"];
export type UpdateNoteRequest = Schemas["UpdateNoteRequest"];
export type SupersedeNoteRequest = Schemas["SupersedeNoteRequest"];
export type RevertNoteRequest = Schemas["RevertNoteRequest"];
export type SearchNotesRequest = Schemas["SearchNotesRequest"];
export type BuildContextRequest = Schemas["BuildContextRequest"];
export type RecordMessagesRequest = Schemas["RecordMessagesRequest"];
export type PutKeyRequest = Schemas["PutKeyRequest"];
export type ForgetRequest = Schemas["ForgetRequest"];

type Query<Op extends keyof operations> = NonNullable<operations[Op]["parameters"]["query"]>;

export type ListNotesQuery = Query<"listNotes">;
export type GetNoteQuery = Query<"getNote">;
export type DiffQuery = Query<"diffNotes">;
export type ListMessagesQuery = Query<"listMessages">;
export type GetKeyQuery = Query<"getKey">;
