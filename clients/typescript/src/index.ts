export { Engram } from "./client.js";
export type { CallOptions, EngramOptions, ForgetTarget, ReadOptions, WriteOptions } from "./client.js";
export { EngramError, isEngramError } from "./errors.js";
export type { EventsOptions } from "./events.js";
export type { Fetch } from "./transport.js";
export type * from "./types.js";
export type { components, operations, paths } from "./schema.js";
