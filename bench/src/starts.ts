/** The handler starts of a drain: how many, the first one's time, and a wait for the last. */

/** Counts a drain's handler starts up to `count`. */
export class Starts {
  #started = 0;
  #first: number | undefined;
  readonly #count: number;
  readonly #now: () => number;
  /** Callers of {@link wait} to wake at the last start. */
  #waiters: (() => void)[] = [];

  /** @param now the clock of the first start (`performance.now()` by default). */
  constructor(count: number, now: () => number = () => performance.now()) {
    this.#count = count;
    this.#now = now;
  }

  /** Handlers started so far. */
  get started(): number {
    return this.#started;
  }

  /** When the first handler started; `undefined` before. */
  get first(): number | undefined {
    return this.#first;
  }

  /** One handler started. */
  record(): void {
    this.#started += 1;
    this.#first ??= this.#now();
    if (this.#started === this.#count) for (const wake of this.#waiters.splice(0)) wake();
  }

  /**
   * Waits `ms`, or less: until every handler has started. A drain polls its database for the end
   * only then, and a plain 20 ms sleep put that up to 20 ms after the last start: about 1 % of
   * the fastest drain (graphile-worker's batched one, ~1.4 s), and nothing of the slow ones, a
   * bias against the fastest system.
   */
  wait(ms: number): Promise<void> {
    if (this.#started >= this.#count) return Promise.resolve();
    return new Promise((resolve) => {
      const wake = (): void => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        this.#waiters = this.#waiters.filter((waiter) => waiter !== wake);
        resolve();
      }, ms);
      this.#waiters.push(wake);
    });
  }
}
