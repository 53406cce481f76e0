/**
 * The default console logger: warnings and errors, each on one line however long its fields
 * (a failed try's warning was a block of several lines), debug and info dropped.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { consoleLogger } from './logger.js';

afterEach(() => {
  vi.restoreAllMocks();
});

describe('consoleLogger', () => {
  it('prints warnings and errors on one line each, with every field, and drops the rest', () => {
    const printed: string[] = [];
    const capture = (...args: unknown[]) => void printed.push(args.map(String).join(' '));
    for (const level of ['debug', 'info', 'warn', 'error'] as const) {
      vi.spyOn(console, level).mockImplementation(capture);
    }
    const fields = {
      slots: 32,
      error: 'the server answered 503 while a gateway in front of it restarted its upstream pool',
      error_name: 'TransportError',
      error_code: 'transport_error',
      nested: { delay_ms: 400, reasons: ['network', 'timeout'] },
    };
    consoleLogger.debug('dropped', fields);
    consoleLogger.info('dropped too', { failures: 12 });
    consoleLogger.warn('acquire failed; retrying', { failures: 1 });
    consoleLogger.warn('acquire failed; retrying', fields);
    consoleLogger.error('worker stopping after an unrecoverable error', fields);
    expect(printed).toHaveLength(3);
    for (const line of printed) expect(line).not.toContain('\n');
    expect(printed[0]).toBe('[ledgence] acquire failed; retrying { failures: 1 }');
    expect(printed[1]).toContain("reasons: [ 'network', 'timeout' ]");
    expect(printed[1]).toContain('gateway in front of it restarted its upstream pool');
  });
});
