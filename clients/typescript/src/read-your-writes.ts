/**
 * Read-your-writes, as the Python client's `ReadYourWrites`: the token of each user's newest
 * write is remembered, and each read of that user sends it as `Engram-Read-After`, so the read
 * waits until that write is applied and never misses this client's own writes.
 */
export class ReadYourWrites {
  private readonly newest = new Map<string, string>();

  constructor(private readonly enabled: boolean) {}

  /** Remember a write's token for `user` (undefined: the token's own user). */
  wrote(user: string | undefined, token: string | null | undefined): void {
    if (!token) return;
    const known = this.newest.get(user ?? "");
    // Writes answered out of order (concurrent calls) must not move the mark back.
    if (known === undefined || !isBefore(token, known)) this.newest.set(user ?? "", token);
  }

  last(user: string | undefined): string | undefined {
    return this.newest.get(user ?? "");
  }

  /** The token a read of `user` waits for: the caller's choice (null: none), else the newest write's. */
  after(user: string | undefined, given: string | null | undefined): string | undefined {
    if (given !== undefined) return given ?? undefined;
    return this.enabled ? this.last(user) : undefined;
  }
}

/**
 * Whether token `a` is older than `b`: both `<partition>:<ms>-<seq>` of one user's partition,
 * ordered as the log's entries are. Tokens of different partitions are not ordered (false).
 */
export function isBefore(a: string, b: string): boolean {
  const [x, y] = [TOKEN.exec(a), TOKEN.exec(b)];
  if (!x || !y || x[1] !== y[1]) return false;
  const [msA, msB] = [BigInt(x[2] ?? 0), BigInt(y[2] ?? 0)];
  return msA < msB || (msA === msB && BigInt(x[3] ?? 0) < BigInt(y[3] ?? 0));
}

const TOKEN = /^(\d+):(\d+)-(\d+)$/;
