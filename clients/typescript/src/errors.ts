import type { ErrorCode, ErrorReply } from "./types.js";

/**
 * Every failure of a call to Engram. `code` is the contract's (`MEMORY_NOT_FOUND`,
 * `VERSION_CONFLICT`, `TIMEOUT`, ...); `status` the HTTP status, or undefined when no answer came
 * (the network failed, or the client's timeout passed). A write that failed carries its
 * `idempotencyKey`: send the same write again with it and it is applied once, whatever happened
 * to the first.
 */
export class EngramError extends Error {
  override readonly name = "EngramError";
  readonly code: ErrorCode;
  readonly status: number | undefined;
  /** How long the service asked to wait before sending again, when it said. */
  readonly retryAfterMs: number | undefined;
  idempotencyKey: string | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    options: { status?: number; retryAfterMs?: number; idempotencyKey?: string; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.status = options.status;
    this.retryAfterMs = options.retryAfterMs;
    this.idempotencyKey = options.idempotencyKey;
  }
}

export function isEngramError(value: unknown, code?: ErrorCode): value is EngramError {
  return value instanceof EngramError && (code === undefined || value.code === code);
}

// What an answer that is not Engram's own error body (a proxy's, say) most likely means.
const CODE_OF_STATUS: Record<number, ErrorCode> = {
  400: "INVALID_PARAMETER",
  401: "PERMISSION_DENIED",
  403: "PERMISSION_DENIED",
  404: "MEMORY_NOT_FOUND",
  409: "VERSION_CONFLICT",
  413: "INVALID_PARAMETER",
  429: "RATE_LIMITED",
  504: "TIMEOUT",
};

/** The error an answer of `status` with `body` (parsed JSON, or text) stands for. */
export function errorOfAnswer(status: number, body: unknown, headers: Headers): EngramError {
  const reply = (body as { error?: Partial<ErrorReply> } | null)?.error;
  const retryAfterMs = reply?.retry_after_ms ?? retryAfterHeaderMs(headers);
  if (reply?.code && typeof reply.message === "string") {
    return new EngramError(reply.code, reply.message, { status, retryAfterMs });
  }
  const code = CODE_OF_STATUS[status] ?? (status >= 500 ? "UNAVAILABLE" : "INVALID_PARAMETER");
  const text = typeof body === "string" && body ? `: ${body.slice(0, 200)}` : "";
  return new EngramError(code, `HTTP ${status} without an Engram error body${text}`, { status, retryAfterMs });
}

/** `Retry-After` in milliseconds: seconds, or an HTTP date. */
export function retryAfterHeaderMs(headers: Headers): number | undefined {
  const value = headers.get("Retry-After");
  if (value === null || value.trim() === "") return undefined;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}
