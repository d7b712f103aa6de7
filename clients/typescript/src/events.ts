/**
 * `GET /v1/events` as an async iterator, over fetch's streaming body (no EventSource, which can
 * send no Authorization header). Each event's SSE id is its consistency token: when the stream
 * drops, it connects again with `Last-Event-ID` set to the last one given out, and the service
 * resumes right after it, so nothing is missed and nothing given twice.
 */
import { EventSourceParserStream } from "eventsource-parser/stream";
import type { EventSourceMessage } from "eventsource-parser";

import { EngramError, errorOfAnswer } from "./errors.js";
import { backoffMs, pause, type Fetch } from "./transport.js";
import type { LogEvent } from "./types.js";

export interface EventsOptions {
  /** Start right after this event (an id a stream gave, or a write's token); else at the log's end. */
  lastEventId?: string;
  /** Ends the iteration (the loop then finishes without an error). */
  signal?: AbortSignal;
  /** The user, for an operator's or a gateway's token. */
  user?: string;
}

export interface StreamSetup {
  fetch: Fetch;
  url: string;
  headers: Headers;
  /** Failed connections in a row before the error is thrown. */
  retries: number;
  /** The longest wait for the stream's headers. */
  timeoutMs: number;
}

const RECONNECTED = new Set([429, 502, 503, 504]);

export async function* followEvents(setup: StreamSetup, options: EventsOptions = {}): AsyncGenerator<LogEvent> {
  const signal = options.signal;
  let last = options.lastEventId;
  let failures = 0;
  while (!signal?.aborted) {
    let body: ReadableStream<Uint8Array>;
    try {
      body = await connect(setup, last, signal);
      failures = 0;
    } catch (error) {
      if (signal?.aborted) return;
      if (!(error instanceof EngramError) || !reconnectable(error) || failures >= setup.retries) throw error;
      await pauseUnlessAborted(error.retryAfterMs ?? backoffMs(failures++), signal);
      continue;
    }
    const messages = messagesOf(body, signal);
    try {
      for (;;) {
        let next: IteratorResult<EventSourceMessage>;
        try {
          next = await messages.next();
        } catch {
          break; // the connection broke: connect again, after the last event had
        }
        if (next.done) break;
        last = next.value.id ?? last;
        yield JSON.parse(next.value.data) as LogEvent;
      }
    } finally {
      // A `break` in the caller's loop ends here too: the connection is closed.
      await messages.return(undefined);
    }
    await pauseUnlessAborted(backoffMs(failures++), signal);
  }
}

async function connect(setup: StreamSetup, last: string | undefined, signal?: AbortSignal) {
  const headers = new Headers(setup.headers);
  headers.set("Accept", "text/event-stream");
  if (last) headers.set("Last-Event-ID", last);
  // The caller's abort and the timeout reach the connecting only: once the stream is open,
  // `messagesOf` closes it on the caller's abort.
  const controller = new AbortController();
  const follow = () => controller.abort(signal?.reason);
  signal?.addEventListener("abort", follow, { once: true });
  const timer = setTimeout(() => controller.abort(new Error("no answer in time")), setup.timeoutMs);
  let answer: Response;
  try {
    answer = await setup.fetch(setup.url, { headers, signal: controller.signal });
  } catch (error) {
    throw new EngramError("UNAVAILABLE", "GET /v1/events: the service could not be reached", { cause: error });
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener("abort", follow);
  }
  if (!answer.ok || answer.body === null) {
    throw errorOfAnswer(answer.status, parsed(await answer.text()), answer.headers);
  }
  return answer.body;
}

async function* messagesOf(body: ReadableStream<Uint8Array>, signal?: AbortSignal): AsyncGenerator<EventSourceMessage> {
  const reader = body
    // The DOM types give the decoder a wider input (any BufferSource) than a body's bytes.
    .pipeThrough(new TextDecoderStream() as unknown as TransformStream<Uint8Array, string>)
    .pipeThrough(new EventSourceParserStream())
    .getReader();
  const stop = () => void reader.cancel().catch(() => undefined);
  signal?.addEventListener("abort", stop, { once: true });
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
    signal?.removeEventListener("abort", stop);
    // Leaving the loop early (break, return, an error) closes the connection.
    await reader.cancel().catch(() => undefined);
  }
}

function reconnectable(error: EngramError): boolean {
  return error.status === undefined || RECONNECTED.has(error.status);
}

async function pauseUnlessAborted(ms: number, signal?: AbortSignal): Promise<void> {
  await pause(ms, signal).catch(() => undefined);
}

function parsed(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
