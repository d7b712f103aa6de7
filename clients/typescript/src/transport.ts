/**
 * Sending one request, again when that is safe and may help. Every call of the client is safe to
 * send twice: reads change nothing, and each write carries an `Idempotency-Key` the service
 * applies once (a repeat answers the first outcome). So a call whose answer did not come (the
 * network failed, or the attempt's timeout passed) or that the service asked to be sent again
 * (429, 503 with Retry-After; 504 TIMEOUT) is sent again, with the same headers and body, a
 * bounded number of times.
 */
import { EngramError, errorOfAnswer, retryAfterHeaderMs } from "./errors.js";

export type Fetch = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

export interface RetryPolicy {
  /** Sends after the first; 0 sends once. */
  retries: number;
  /** The longest one attempt may take, answer body included. */
  timeoutMs: number;
}

const SENT_AGAIN = new Set([429, 503, 504]);
const FIRST_BACKOFF_MS = 200;
const LONGEST_BACKOFF_MS = 5_000;
// Longer than this and the service is better told to the caller than waited for.
const LONGEST_TOLD_WAIT_MS = 30_000;

/** Our own timeout's reason, told apart from the caller's abort. */
class AttemptTimedOut extends Error {
  override readonly name = "TimeoutError";
}

/**
 * A fetch for openapi-fetch that sends `request` again under `policy`. The answer it returns is
 * read to its end (the timeout covers it) and is the last one had; when none came, it throws an
 * `EngramError` (`TIMEOUT` or `UNAVAILABLE`). The caller's abort ends it at once, with its reason.
 */
export function sendingAgain(fetch: Fetch, policy: RetryPolicy): (request: Request) => Promise<Response> {
  return async (request: Request): Promise<Response> => {
    const body = request.body === null ? undefined : await request.arrayBuffer();
    const init: RequestInit = { method: request.method, headers: request.headers, body, redirect: request.redirect };
    const caller = request.signal;
    for (let attempt = 0; ; attempt++) {
      const last = attempt >= policy.retries;
      let answer: Response;
      try {
        answer = await attemptOnce(fetch, request.url, init, caller, policy.timeoutMs);
      } catch (error) {
        if (caller.aborted) throw caller.reason;
        if (last) throw unanswered(error, request, attempt + 1, policy.timeoutMs);
        await pause(backoffMs(attempt), caller);
        continue;
      }
      if (last || !SENT_AGAIN.has(answer.status)) return answer;
      const told = await toldWaitMs(answer);
      if (told !== undefined && told > LONGEST_TOLD_WAIT_MS) return answer;
      await pause(told ?? backoffMs(attempt), caller);
    }
  };
}

async function attemptOnce(
  fetch: Fetch,
  url: string,
  init: RequestInit,
  caller: AbortSignal,
  timeoutMs: number,
): Promise<Response> {
  if (caller.aborted) throw caller.reason;
  const controller = new AbortController();
  const follow = () => controller.abort(caller.reason);
  caller.addEventListener("abort", follow, { once: true });
  const timer = setTimeout(() => controller.abort(new AttemptTimedOut(`no answer within ${timeoutMs} ms`)), timeoutMs);
  try {
    const answer = await fetch(url, { ...init, signal: controller.signal });
    // Read here, under the timeout: an answer whose body stalls is no answer.
    const content = await answer.arrayBuffer();
    const empty = answer.status === 204 || answer.status === 304;
    return new Response(empty ? null : content, {
      status: answer.status,
      statusText: answer.statusText,
      headers: answer.headers,
    });
  } finally {
    clearTimeout(timer);
    caller.removeEventListener("abort", follow);
  }
}

function unanswered(error: unknown, request: Request, attempts: number, timeoutMs: number): EngramError {
  const what = `${request.method} ${new URL(request.url).pathname}`;
  const timedOut = error instanceof AttemptTimedOut || (error instanceof Error && error.name === "TimeoutError");
  const tries = attempts === 1 ? "once" : `${attempts} times`;
  const key = request.headers.get("Idempotency-Key");
  const retry = key ? `; it may have been applied: send it again with idempotencyKey "${key}" and it is applied once` : "";
  if (timedOut) {
    return new EngramError("TIMEOUT", `${what}: no answer within ${timeoutMs} ms, sent ${tries}${retry}`, {
      cause: error,
    });
  }
  const reason = error instanceof Error ? error.message : String(error);
  return new EngramError("UNAVAILABLE", `${what}: the service could not be reached (${reason}), sent ${tries}${retry}`, {
    cause: error,
  });
}

/** The wait the answer asks for: the error body's `retry_after_ms`, else `Retry-After`. */
async function toldWaitMs(answer: Response): Promise<number | undefined> {
  let body: unknown;
  try {
    body = await answer.clone().json();
  } catch {
    return retryAfterHeaderMs(answer.headers);
  }
  return errorOfAnswer(answer.status, body, answer.headers).retryAfterMs;
}

/** Exponential, with jitter so that clients refused together do not come back together. */
export function backoffMs(attempt: number): number {
  const ceiling = Math.min(LONGEST_BACKOFF_MS, FIRST_BACKOFF_MS * 2 ** attempt);
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

/** Waits `ms`, or until `signal` aborts (then throws its reason). */
export function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const done = () => {
      signal?.removeEventListener("abort", aborted);
      resolve();
    };
    const timer = setTimeout(done, ms);
    const aborted = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", aborted, { once: true });
  });
}
