import {
  CLEANUP_GRACE_MS,
  LEASE_DURATION_MS,
  LEASE_SAFETY_MARGIN_MS,
  SESSION_VALIDITY_MS,
  TERMINAL_RETENTION_MS,
} from '@ledgence/contracts';

/**
 * The lease timings the lifecycle rules use. Defaults are the contract limits
 * (DESIGN §12); the server reads overrides from its environment and tests
 * shorten them (to about a second) to exercise expiry quickly.
 */
export interface LifecycleConfig {
  /** Lease length granted by a claim or a renewal, capped by the authority deadline. */
  leaseDurationMs: number;
  /** Time after the attempt deadline in which the worker may still clean up and report. */
  cleanupGraceMs: number;
  /** Dispatch is refused when no more execution budget than this remains. */
  leaseSafetyMarginMs: number;
  /** Validity of a session from its opening or last extension. */
  sessionValidityMs: number;
  /**
   * How long a namespace without a retention policy of its own keeps terminal
   * tasks (`LEDGENCE_TERMINAL_RETENTION_MS`), at least MIN_RETENTION_MS.
   */
  terminalRetentionMs: number;
}

/** The contract defaults of every {@link LifecycleConfig} timing. */
export const DEFAULT_LIFECYCLE_CONFIG: Readonly<LifecycleConfig> = Object.freeze({
  leaseDurationMs: LEASE_DURATION_MS,
  cleanupGraceMs: CLEANUP_GRACE_MS,
  leaseSafetyMarginMs: LEASE_SAFETY_MARGIN_MS,
  sessionValidityMs: SESSION_VALIDITY_MS,
  terminalRetentionMs: TERMINAL_RETENTION_MS,
});

/** A full configuration from partial overrides. */
export function lifecycleConfig(overrides: Partial<LifecycleConfig> = {}): LifecycleConfig {
  return { ...DEFAULT_LIFECYCLE_CONFIG, ...overrides };
}
