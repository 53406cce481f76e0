import { inspect } from 'node:util';
import { DESTINATION_ALIAS_MAX_BYTES, LedgenceError } from '@ledgence/contracts';
import { describe, expect, it } from 'vitest';
import {
  createDestination,
  type DestinationProblem,
  DestinationsError,
  parseDestinations,
} from './destinations.js';

const KEY = Buffer.alloc(32, 0xab);
const SECRET = `whsec_${KEY.toString('base64')}`;
const good = { url: 'https://billing.internal/hooks/ledgence', secret: SECRET, timeout_ms: 2_000 };

/** The problems parseDestinations reports for `document` (throws if it accepts it). */
function problems(document: unknown, text = JSON.stringify(document)): DestinationProblem[] {
  try {
    parseDestinations(text);
  } catch (error) {
    expect(error).toBeInstanceOf(DestinationsError);
    const { problems: found, message } = error as DestinationsError;
    // Whatever went wrong, no secret is ever echoed.
    expect(message).not.toContain(KEY.toString('base64'));
    expect(message).not.toContain('c2VjcmV0LXNlY3JldA');
    return [...found];
  }
  throw new Error('expected a DestinationsError');
}

describe('parseDestinations accepts', () => {
  it('the DESIGN §8 shape, keeping the secret as key bytes', () => {
    const destinations = parseDestinations(
      JSON.stringify({ billing: good, audit: { url: 'http://127.0.0.1:9000/h', secret: SECRET } }),
    );
    expect([...destinations.keys()]).toEqual(['billing', 'audit']);
    const billing = destinations.get('billing');
    expect(billing).toMatchObject({
      alias: 'billing',
      url: 'https://billing.internal/hooks/ledgence',
      timeoutMs: 2_000,
    });
    expect(Buffer.isBuffer(billing?.secret)).toBe(true);
    expect(billing?.secret.equals(KEY)).toBe(true);
    // Default timeout; loopback and private addresses are operator configuration, so allowed.
    expect(destinations.get('audit')?.timeoutMs).toBe(5_000);
    expect(
      parseDestinations(
        JSON.stringify({ a: { url: 'http://10.0.0.7:8080/', secret: SECRET } }),
      ).get('a')?.url,
    ).toBe('http://10.0.0.7:8080/');
  });

  it('an empty object (no destinations) and the timeout bounds', () => {
    expect(parseDestinations('{}').size).toBe(0);
    for (const timeout_ms of [100, 60_000]) {
      const parsed = parseDestinations(JSON.stringify({ a: { ...good, timeout_ms } }));
      expect(parsed.get('a')?.timeoutMs).toBe(timeout_ms);
    }
  });

  it('an alias of exactly DESTINATION_ALIAS_MAX_BYTES, and one of non-ASCII text', () => {
    const long = 'a'.repeat(DESTINATION_ALIAS_MAX_BYTES);
    expect(parseDestinations(JSON.stringify({ [long]: good, fäcturé: good })).size).toBe(2);
  });

  it('a secret of exactly 24 bytes', () => {
    const secret = `whsec_${Buffer.alloc(24, 1).toString('base64')}`;
    expect(
      parseDestinations(JSON.stringify({ a: { ...good, secret } })).get('a')?.secret,
    ).toHaveLength(24);
  });
});

describe('parsed destinations never show their secret', () => {
  it('in JSON, inspection or spread', () => {
    const destination = parseDestinations(JSON.stringify({ billing: good })).get('billing');
    const b64 = KEY.toString('base64');
    expect(JSON.stringify(destination)).not.toContain('secret');
    expect(inspect(destination, { depth: 5 })).not.toContain('secret');
    expect(inspect(destination, { depth: 5 })).not.toContain(b64);
    expect(Object.keys({ ...destination })).toEqual(['alias', 'url', 'timeoutMs']);
    expect(Object.isFrozen(destination)).toBe(true);
  });

  it('createDestination copies the key', () => {
    const key = Buffer.alloc(24, 3);
    const destination = createDestination({ alias: 'a', url: 'http://x/', secret: key });
    key.fill(0);
    expect(destination.secret.equals(Buffer.alloc(24, 3))).toBe(true);
    expect(destination.timeoutMs).toBe(5_000);
  });
});

describe('parseDestinations refuses', () => {
  it('a document that is not a JSON object, without quoting it', () => {
    const leaky = `{"billing": {"secret": "whsec_c2VjcmV0LXNlY3JldA==" oops}}`;
    const [syntax] = problems(undefined, leaky);
    expect(syntax?.message).toMatch(/^LEDGENCE_CALLBACK_DESTINATIONS must be a JSON object/);
    expect(syntax?.alias).toBeUndefined();
    for (const text of ['[]', 'null', '"x"', '']) expect(problems(undefined, text)).toHaveLength(1);
    // Duplicate aliases are ambiguous: which secret was meant?
    expect(
      problems(undefined, `{"a": ${JSON.stringify(good)}, "a": ${JSON.stringify(good)}}`)[0]
        ?.message,
    ).toContain('duplicate_key at $.a');
  });

  it('bad aliases, naming them', () => {
    for (const alias of [
      '',
      ' billing',
      'bill\u0007ing',
      'a'.repeat(DESTINATION_ALIAS_MAX_BYTES + 1),
    ]) {
      const [problem] = problems({ [alias]: good });
      expect(problem?.alias).toBe(alias);
      expect(problem?.message).toContain(`destination ${JSON.stringify(alias)}: the alias`);
    }
  });

  it('an entry that is not an object', () => {
    for (const entry of ['https://x', null, [good], 5]) {
      expect(problems({ billing: entry })).toEqual([
        {
          alias: 'billing',
          message:
            'LEDGENCE_CALLBACK_DESTINATIONS: destination "billing" must be an object with url and secret',
        },
      ]);
    }
  });

  it('bad URLs: missing, relative, not http(s), with credentials, too long, with controls', () => {
    const cases: [unknown, string][] = [
      [undefined, 'is required'],
      [42, 'must be a string'],
      ['', 'must not be empty'],
      ['/hooks', 'must be an absolute URL'],
      ['ftp://files.internal/x', 'must use http or https'],
      ['file:///etc/passwd', 'must use http or https'],
      ['https://user:pw@billing.internal/', 'must not contain credentials'],
      [`https://x.internal/${'a'.repeat(2048)}`, 'must be at most 2048 UTF-8 bytes'],
      ['https://x.internal/\n', 'must not contain control characters'],
    ];
    for (const [url, message] of cases) {
      const [problem] = problems({ billing: { ...good, url } });
      expect(problem).toMatchObject({ alias: 'billing', field: 'url' });
      expect(problem?.message).toContain(`destination "billing": url ${message}`);
    }
  });

  it('bad secrets, never echoing them', () => {
    const cases: unknown[] = [
      undefined,
      42,
      KEY.toString('base64'), // no prefix
      `whsec_${KEY.toString('base64url')}`, // base64url alphabet: not what receivers decode
      `whsec_${KEY.toString('base64').replace(/=+$/, '')}==x`,
      `whsec_${Buffer.alloc(25, 0xab).toString('base64').replace(/=+$/, '')}`, // no padding
      'whsec_c2VjcmV0LXNlY3JldA==', // 13 bytes
      'whsec_',
      `WHSEC_${KEY.toString('base64')}`,
    ];
    for (const secret of cases) {
      const [problem] = problems({ billing: { ...good, secret } });
      expect(problem).toMatchObject({ alias: 'billing', field: 'secret' });
      expect(problem?.message).toContain('destination "billing": secret ');
      if (typeof secret === 'string' && secret.length > 'whsec_'.length) {
        expect(problem?.message).not.toContain(secret);
      }
    }
    expect(
      problems({ billing: { ...good, secret: 'whsec_c2VjcmV0LXNlY3JldA==' } })[0]?.message,
    ).toContain('at least 24 bytes (it holds 13)');
  });

  it('bad timeouts', () => {
    for (const timeout_ms of [99, 60_001, 1_000.5, '5000', null, -1]) {
      const [problem] = problems({ billing: { ...good, timeout_ms } });
      expect(problem).toMatchObject({ alias: 'billing', field: 'timeout_ms' });
      expect(problem?.message).toContain('timeout_ms must be an integer from 100 to 60000');
    }
  });

  it('unknown fields, so a typo is not silently ignored', () => {
    const [problem] = problems({ billing: { ...good, timeout: 1_000 } });
    expect(problem).toMatchObject({ alias: 'billing', field: 'timeout' });
    expect(problem?.message).toContain('unknown field "timeout"');
  });

  it('a secret out of place (its "secret": label forgotten, pasted as a field or an alias), never echoing it', () => {
    const key = KEY.toString('base64');
    const random = 'q3Zs8d0bK1mF2pL9xV7cT4yN6hJ5gR0aW1eU3iO8kM2=';
    // A syntax error while the parser reads the secret as a name: the path it reports is made
    // of the names read so far (until 2026-12-05 it quoted the secret whole).
    // A 64-byte key without its prefix is past the 64 characters a path shows of a name: it is
    // judged by the part shown.
    const longKey = Buffer.from(Array.from({ length: 64 }, (_, i) => (i * 37 + 11) % 256)).toString(
      'base64',
    );
    for (const pasted of [SECRET, longKey]) {
      const syntax = problems(undefined, `{"billing": {"url": "${good.url}", "${pasted}"}}`);
      expect(syntax.map((p) => p.message)).toEqual([
        'LEDGENCE_CALLBACK_DESTINATIONS must be a JSON object of destinations (syntax at $.billing[…])',
      ]);
    }
    for (const name of [SECRET, random, `whsec_${random}`]) {
      const asField = problems({ billing: { ...good, [name]: true } });
      expect(asField).toEqual([
        {
          alias: 'billing',
          message:
            'LEDGENCE_CALLBACK_DESTINATIONS: destination "billing": unknown field (not shown: it looks like a secret) (expected url, secret, timeout_ms)',
        },
      ]);
      const asAlias = problems({ [name]: { url: good.url } });
      expect(asAlias).toEqual([
        {
          field: 'secret',
          message:
            'LEDGENCE_CALLBACK_DESTINATIONS: destination (not shown: it looks like a secret): secret is required',
        },
      ]);
      expect(JSON.stringify([asField, asAlias])).not.toContain(random.slice(0, 20));
      expect(JSON.stringify([asField, asAlias])).not.toContain(key.slice(0, 20));
    }
    // A long name that is no secret (no digits and both cases) is shown as written.
    const long = 'billing_service_production_eu_west_1';
    expect(problems({ [long]: { ...good, timeout: 1 } })[0]?.message).toContain(
      `destination "${long}": unknown field "timeout"`,
    );
  });

  it('reporting every problem of every destination at once, under the given source', () => {
    let error: unknown;
    try {
      parseDestinations(
        JSON.stringify({
          ok: good,
          a: { url: 'ftp://x', secret: 'nope', timeout_ms: 1 },
          b: { secret: SECRET },
        }),
        { source: 'LEDGENCE_CALLBACK_DESTINATIONS_FILE' },
      );
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(DestinationsError);
    expect(error).toBeInstanceOf(LedgenceError);
    const found = (error as DestinationsError).problems;
    expect(found.map((p) => `${p.alias}.${p.field}`)).toEqual([
      'a.url',
      'a.secret',
      'a.timeout_ms',
      'b.url',
    ]);
    expect((error as Error).message).toMatch(
      /^Invalid callback destinations \(4 problems\):\n {2}- /,
    );
    expect(found.every((p) => p.message.startsWith('LEDGENCE_CALLBACK_DESTINATIONS_FILE: '))).toBe(
      true,
    );
  });
});
