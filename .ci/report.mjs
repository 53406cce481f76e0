// Counts passed, failed and skipped tests from vitest's JSON reports, and names each failed test
// with the head of its failure message: CI keeps only the tail of its output, so without this the
// record of a failed run says how many tests failed but not which, nor why.
// The record keeps standard output only (a failed run on record named no test when these lines went
// to stderr), so everything goes to stdout, the counts last.
// Usage: node .ci/report.mjs report.json... → stdout: the failures, then "passed failed skipped".
import { readFileSync } from 'node:fs';

const MESSAGE_LINES = 12;
const total = [0, 0, 0];
const failures = [];
for (const file of process.argv.slice(2)) {
  let report;
  try {
    report = JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    continue; // a step that never ran leaves no report; its step failure is counted instead
  }
  total[0] += report.numPassedTests;
  total[1] += report.numFailedTests;
  total[2] += report.numPendingTests + report.numTodoTests;
  for (const suite of report.testResults) {
    const failed = suite.assertionResults.filter((test) => test.status === 'failed');
    // A file that fails to load or whose hooks throw has no failed test, only a suite message.
    if (failed.length === 0 && suite.status === 'failed') {
      failures.push({ file: suite.name, title: '(the file itself)', messages: [suite.message] });
    }
    for (const test of failed) {
      failures.push({ file: suite.name, title: test.fullName, messages: test.failureMessages });
    }
  }
}
for (const { file, title, messages } of failures) {
  console.log(`::: FAILED ${file.replace(`${process.cwd()}/`, '')} > ${title}`);
  const lines = messages
    .join('\n')
    .split('\n')
    .filter((line) => line.trim() !== '');
  for (const line of lines.slice(0, MESSAGE_LINES)) console.log(`    ${line}`);
}
console.log(total.join(' '));
