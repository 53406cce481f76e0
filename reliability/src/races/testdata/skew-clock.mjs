/**
 * A preload (`node --import`) that skews this process's wall clock by
 * `LEDGENCE_CLOCK_SKEW_MS` (e.g. 600000 = ten minutes fast): `Date.now()` and
 * `new Date()` move, while timers and `performance.now()` stay monotonic, as
 * on a machine whose NTP is wrong. With `LEDGENCE_CLOCK_STEP_MS`, SIGUSR2
 * steps the clock by that much more (an NTP correction while work runs).
 * Plain JavaScript, so it loads before tsx.
 */
const number = (name) => {
  const value = Number(process.env[name] ?? 0);
  if (!Number.isFinite(value)) throw new Error(`${name} must be a number of ms`);
  return value;
};
let skew = number('LEDGENCE_CLOCK_SKEW_MS');
const step = number('LEDGENCE_CLOCK_STEP_MS');
if (step !== 0) {
  process.on('SIGUSR2', () => {
    skew += step;
  });
}

const RealDate = Date;
const realNow = RealDate.now.bind(RealDate);

class SkewedDate extends RealDate {
  constructor(...args) {
    // Only "now" is skewed; a date built from given parts or a timestamp is what it says.
    if (args.length === 0) super(realNow() + skew);
    else super(...args);
  }

  static now() {
    return realNow() + skew;
  }
}

globalThis.Date = SkewedDate;
