/**
 * Named crash points for the reliability suites (issue #8, T2): places in the
 * commit and reply paths where a test can make the server die (or fail) on
 * purpose, to prove that the client's retries converge whatever moment the
 * process is lost at.
 *
 * TEST ONLY. Failpoints are compiled in but armed solely through the
 * `LEDGENCE_FAILPOINTS` environment variable; unset (every production
 * deployment), the server gets {@link NO_FAILPOINTS}, whose `enabled` is
 * `false`, so each point costs one predictable branch on the hot path.
 *
 * No module state: a {@link Failpoints} object is made from a spec and passed
 * by dependency injection (store option, sender option, server wiring), so two
 * servers in one process (tests) keep separate counts.
 *
 * Grammar of a spec (whitespace around tokens is ignored):
 *
 * ```text
 * spec   = "" | entry *("," entry)
 * entry  = name "=" action ["*" count]
 * name   = one of FAILPOINTS, e.g. settle.after_commit
 * action = "crash"   ; SIGKILL this process at that point (nothing after it runs)
 *        | "error"   ; throw a FailpointError there (the operation fails as unavailable)
 *        | "off"     ; never fires (to disable an entry without deleting it)
 * count  = 1*DIGIT   ; fire on the first `count` hits only; without it, every hit
 * ```
 *
 * Example: `LEDGENCE_FAILPOINTS=settle.after_commit=crash,submit.before_commit=error*2`.
 */

/** The operations whose store transaction has a before/after-commit point. */
export const FAILPOINT_STORE_OPERATIONS = [
  'submit',
  'acquire',
  'renew',
  'settle',
  'quiescence',
  'cancel',
  'recovery',
  'subscribe',
  'redeliver',
  'session_open',
  'session_extend',
  'delivery_lease',
  'retention_policy',
  'retention_collect',
] as const;

/** An operation of {@link FAILPOINT_STORE_OPERATIONS}. */
export type FailpointStoreOperation = (typeof FAILPOINT_STORE_OPERATIONS)[number];

/**
 * The operations served over HTTP that also have an after-reply point. Subscribe, redeliver,
 * the session routes and the retention policy have commit points only: their replies carry
 * nothing a retry could not get again (a subscription key, a generation, a session id the
 * worker replaces, the policy).
 */
export type FailpointRouteOperation = Exclude<
  FailpointStoreOperation,
  | 'recovery'
  | 'subscribe'
  | 'redeliver'
  | 'session_open'
  | 'session_extend'
  | 'delivery_lease'
  | 'retention_policy'
  | 'retention_collect'
>;

/**
 * Every failpoint, with where it sits. Coverage in the reliability suite is
 * computed against this list, so a new point without a test shows as a gap.
 */
export const FAILPOINTS = {
  'submit.before_commit': 'submit: the transaction did its work, COMMIT not yet sent',
  'submit.after_commit': 'submit: committed, the reply not yet built',
  'submit.after_reply': 'submit: the HTTP reply was handed to the socket',
  'acquire.before_commit': 'acquire: a task was claimed, COMMIT not yet sent',
  'acquire.after_commit': 'acquire: the claim committed, the reply not yet built',
  'acquire.after_reply': 'acquire: an assignment reply was handed to the socket',
  'renew.before_commit': 'renew: the lease was extended, COMMIT not yet sent',
  'renew.after_commit': 'renew: committed, the reply not yet built',
  'renew.after_reply': 'renew: the HTTP reply was handed to the socket',
  'settle.before_commit': 'settle: the settlement was applied, COMMIT not yet sent',
  'settle.after_commit': 'settle: committed, the reply not yet built',
  'settle.after_reply': 'settle: the HTTP reply was handed to the socket',
  'quiescence.before_commit':
    'quiescence: cleanup confirmed and the held decision applied, COMMIT not yet sent',
  'quiescence.after_commit': 'quiescence: committed, the reply not yet built',
  'quiescence.after_reply': 'quiescence: the HTTP reply was handed to the socket',
  'cancel.before_commit':
    'cancel: the task was cancelled or its cancel requested, COMMIT not yet sent',
  'cancel.after_commit': 'cancel: committed, the reply not yet built',
  'cancel.after_reply': 'cancel: the HTTP reply was handed to the socket',
  'recovery.before_commit': 'recovery: expired leases were found and released, COMMIT not yet sent',
  'recovery.after_commit': 'recovery: committed, the progress not yet returned',
  'subscribe.before_commit':
    'completion subscribe: the subscription was inserted (due at once on a finished task), COMMIT not yet sent',
  'subscribe.after_commit': 'completion subscribe: committed, the reply not yet built',
  'redeliver.before_commit':
    'completion redeliver: the next generation was made due, COMMIT not yet sent',
  'redeliver.after_commit': 'completion redeliver: committed, the reply not yet built',
  'session_open.before_commit':
    'worker session open: the session was inserted, COMMIT not yet sent',
  'session_open.after_commit': 'worker session open: committed, the reply not yet built',
  'session_extend.before_commit':
    'worker session extend: the expiry was moved, COMMIT not yet sent',
  'session_extend.after_commit': 'worker session extend: committed, the reply not yet built',
  'delivery_lease.before_commit':
    'callback delivery: due deliveries were leased (a try counted), COMMIT not yet sent',
  'delivery_lease.after_commit':
    'callback delivery: the lease committed, the leases not yet returned to the sender',
  'retention_policy.before_commit':
    'retention policy set: the policy and its retiring floor were written, COMMIT not yet sent',
  'retention_policy.after_commit': 'retention policy set: committed, the reply not yet built',
  'retention_collect.before_commit':
    'retention collection: retired tasks (or expired sessions) were deleted, COMMIT not yet sent',
  'retention_collect.after_commit':
    'retention collection: committed, the progress not yet returned',
  'delivery.before_send': 'callback delivery: leased, the POST not yet sent',
  'delivery.after_send': 'callback delivery: the receiver answered, the outcome not yet reported',
  'delivery.after_report': 'callback delivery: the outcome was recorded in the store',
} as const;

/** The name of a failpoint. */
export type FailpointName = keyof typeof FAILPOINTS;

/** Every failpoint name, in declaration order. */
export const FAILPOINT_NAMES = Object.keys(FAILPOINTS) as readonly FailpointName[];

/** What an armed failpoint does when hit. */
export type FailpointAction = 'crash' | 'error' | 'off';

/** One parsed entry of a spec. */
export interface FailpointSetting {
  /** The failpoint the entry arms. */
  readonly name: FailpointName;
  /** What it does when hit; an `off` entry arms nothing. */
  readonly action: FailpointAction;
  /** Fire on the first `count` hits only; `undefined` = every hit. */
  readonly count: number | undefined;
}

/** A spec could not be parsed; `message` names the entry and what would be right. */
export class FailpointSpecError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FailpointSpecError';
  }
}

/** Thrown where a failpoint armed with `error` is hit. */
export class FailpointError extends Error {
  constructor(readonly failpoint: FailpointName) {
    super(`failpoint ${failpoint} fired`);
    this.name = 'FailpointError';
  }
}

/** The failpoints a process runs with. */
export interface Failpoints {
  /**
   * Whether any point is armed. Call sites test it before building a name or
   * calling {@link hit}, so the disabled case costs one branch.
   */
  readonly enabled: boolean;
  /** Passes the point `name`: crashes, throws a {@link FailpointError}, or returns. */
  hit(name: FailpointName): void;
}

/** The failpoints of every normal run: none armed. */
export const NO_FAILPOINTS: Failpoints = Object.freeze({ enabled: false, hit() {} });

const ACTIONS: readonly FailpointAction[] = ['crash', 'error', 'off'];

/**
 * Parses a `LEDGENCE_FAILPOINTS` spec (grammar in the module comment).
 * Throws a {@link FailpointSpecError} for an unknown name or action, a bad
 * count or a name given twice: a typo must stop the server, not silently arm
 * nothing and let a crash test pass without crashing.
 */
export function parseFailpoints(spec: string): FailpointSetting[] {
  const settings: FailpointSetting[] = [];
  if (spec.trim() === '') return settings;
  const seen = new Set<string>();
  for (const raw of spec.split(',')) {
    const entry = raw.trim();
    const match = /^([a-z_.]+)\s*=\s*([a-z]+)\s*(?:\*\s*(\d+))?$/.exec(entry);
    if (match === null) {
      throw new FailpointSpecError(
        `"${entry}" is not a failpoint entry; write name=action[*count], e.g. settle.after_commit=crash`,
      );
    }
    const [, name = '', action = '', count] = match;
    if (!Object.hasOwn(FAILPOINTS, name)) {
      throw new FailpointSpecError(
        `unknown failpoint "${name}"; known: ${FAILPOINT_NAMES.join(', ')}`,
      );
    }
    if (!(ACTIONS as readonly string[]).includes(action)) {
      throw new FailpointSpecError(
        `failpoint ${name}: unknown action "${action}"; use ${ACTIONS.join(', ')}`,
      );
    }
    const times = count === undefined ? undefined : Number(count);
    if (times !== undefined && (!Number.isSafeInteger(times) || times < 1)) {
      throw new FailpointSpecError(`failpoint ${name}: the count must be a whole number ≥ 1`);
    }
    if (seen.has(name)) throw new FailpointSpecError(`failpoint ${name} is given twice`);
    seen.add(name);
    settings.push({ name: name as FailpointName, action: action as FailpointAction, count: times });
  }
  return settings;
}

/** Options of {@link createFailpoints}. */
export interface FailpointsOptions {
  /**
   * Called as a point fires, before its action (the server writes one line to
   * stderr, which is how a test sees which point killed the process).
   */
  onFire?: (name: FailpointName, action: FailpointAction) => void;
  /** How `crash` ends the process; default SIGKILL to itself (no cleanup, no flush). */
  crash?: () => void;
}

/**
 * Failpoints armed as `settings` say; {@link NO_FAILPOINTS} when none is
 * armed. Hit counts are per object, i.e. per process for the server.
 *
 * @example
 * ```ts
 * const failpoints = createFailpoints(parseFailpoints('settle.after_commit=crash'));
 * if (failpoints.enabled) failpoints.hit('settle.after_commit'); // the process is gone
 * ```
 */
export function createFailpoints(
  settings: readonly FailpointSetting[],
  options: FailpointsOptions = {},
): Failpoints {
  const armed = new Map<FailpointName, { action: FailpointAction; left: number }>();
  for (const setting of settings) {
    if (setting.action === 'off') continue;
    armed.set(setting.name, {
      action: setting.action,
      left: setting.count ?? Number.POSITIVE_INFINITY,
    });
  }
  if (armed.size === 0) return NO_FAILPOINTS;
  const crash = options.crash ?? (() => process.kill(process.pid, 'SIGKILL'));
  return {
    enabled: true,
    hit(name) {
      const point = armed.get(name);
      if (point === undefined || point.left <= 0) return;
      point.left -= 1;
      options.onFire?.(name, point.action);
      if (point.action === 'crash') crash();
      // Reached for `error`, and for a `crash` stub in unit tests.
      throw new FailpointError(name);
    },
  };
}
