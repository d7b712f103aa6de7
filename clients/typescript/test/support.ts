/** What the tests share: clients of the test service, and a fetch that keeps what was sent. */
import { Engram, type EngramOptions, type Fetch } from "engram-ledger";

import { engramApi, tokenFor, type Api } from "./service.js";

export interface Sent {
  method: string;
  path: string;
  headers: Headers;
}

/** A fetch that records each request (method, path, headers) before `inner` sends it. */
export function recording(inner: Fetch = (input, init) => fetch(input, init)): { fetch: Fetch; sent: Sent[] } {
  const sent: Sent[] = [];
  const recorder: Fetch = (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    sent.push({ method: init?.method ?? "GET", path: url.pathname + url.search, headers: new Headers(init?.headers) });
    return inner(input, init);
  };
  return { fetch: recorder, sent };
}

/** A client acting as `user`, with a token of its own (as an application holds). */
export async function clientOf(user: string, options: Partial<EngramOptions> = {}): Promise<{ engram: Engram; api: Api }> {
  const api = await engramApi();
  return { engram: new Engram({ baseUrl: api.baseUrl, token: tokenFor(api, user), ...options }), api };
}

/** A client with the operator's token (names the user per call, or `user` for all). */
export async function operatorClient(options: Partial<EngramOptions> = {}): Promise<Engram> {
  const api = await engramApi();
  return new Engram({ baseUrl: api.baseUrl, token: api.operatorToken, ...options });
}

/** A user name no other test uses. */
export function someone(name: string): string {
  return `${name}-${crypto.randomUUID().slice(0, 8)}`;
}
