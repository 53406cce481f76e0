/**
 * The limits table (DESIGN §12) and the bounds the wire types need besides.
 * Each limit lives here once; the server, the store and the SDK import it.
 * All times are milliseconds. None of these is a concurrency knob.
 */

const KiB = 1024;
const MiB = 1024 * KiB;
const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

// ---- Request and reply sizes ------------------------------------------------

/** Maximum incoming submit request bytes and normalized submission bytes: room for 1 MiB of data plus its envelope and escaping. */
export const SUBMISSION_MAX_BYTES = 2 * MiB;
/** Maximum compact JSON encoding of the application-owned submission data; larger inputs belong in object storage, referenced from the task. */
export const SUBMISSION_DATA_MAX_BYTES = 1 * MiB;
/** Maximum settle request bytes: a 1 MiB output or error details plus the report envelope. */
export const SETTLEMENT_MAX_BYTES = 2 * MiB;
/** Maximum compact JSON encoding of a task's output; mirrors the data limit so results stay cheap to store and return. */
export const OUTPUT_MAX_BYTES = 1 * MiB;
/**
 * Complete broker-record/claim-command limit, including JSON whitespace: these envelopes carry
 * identifiers only, never application payloads. Bounds the body of `POST /v1/worker/acquire` (the
 * claim command) and every URI reference (event `source`, `result_ref`).
 */
export const DISPATCH_MAX_BYTES = 4 * KiB;
/** Maximum encoded compact status reply: status carries scheduling metadata only, so it stays small enough to poll cheaply. */
export const TASK_STATUS_MAX_BYTES = 8 * KiB;
/** Maximum encoded task page: bounds one list reply's memory on both ends. */
export const TASK_PAGE_MAX_BYTES = 1 * MiB;
/** Maximum bytes of an opaque task cursor: it holds a position and a filter fingerprint, nothing a client can grow. */
export const TASK_CURSOR_MAX_BYTES = 1 * KiB;
/** Maximum bytes of a worker control request (session, renew, quiescence; acquire has DISPATCH_MAX_BYTES): identifiers only. */
export const CONTROL_REQUEST_MAX_BYTES = 16 * KiB;
/** Maximum bytes of a batch request body: 1 000 small commands fit; a batch of huge payloads should be split. */
export const BATCH_MAX_BYTES = 16 * MiB;
/**
 * Maximum encoded acquire batch reply (seed `CLAIM_REPLY_MAX_BYTES`: "claim responses can contain
 * a complete assignment and its application data"): a batch stops claiming before its replies
 * would pass it, and answers the slots left `empty`. One assignment always fits: its data is at
 * most SUBMISSION_DATA_MAX_BYTES.
 */
export const ACQUIRE_BATCH_REPLY_MAX_BYTES = 16 * MiB;
/** Maximum bytes of a completion subscribe or redeliver command: a key and an alias. */
export const COMPLETION_COMMAND_MAX_BYTES = 4 * KiB;
/** Maximum encoded completion CloudEvent: it references the result, never copies it. */
export const COMPLETION_EVENT_MAX_BYTES = 4 * KiB;

// ---- JSON shape -------------------------------------------------------------

/** Maximum nesting depth of application JSON (`data`, `output`, error `details`); bounds recursion everywhere the value is walked. */
export const JSON_MAX_DEPTH = 64;
/** Maximum nesting depth of a whole command: application JSON plus the deepest envelope (a settle inside a batch) around it. */
export const COMMAND_MAX_DEPTH = JSON_MAX_DEPTH + 8;
/** Largest magnitude a JSON number may have: beyond it JavaScript and PostgreSQL `jsonb` readers disagree, so it is rejected rather than rounded. */
export const JSON_MAX_SAFE_NUMBER = Number.MAX_SAFE_INTEGER;

// ---- Text fields ------------------------------------------------------------

/** Tenant and namespace names: stored in every indexed row, so kept short. */
export const SCOPE_TEXT_MAX_BYTES = 128;
/** Queue names, program names and versions, concurrency keys, identifiers issued by the server. */
export const NAME_MAX_BYTES = 128;
/** Idempotency keys and subscription keys: room for a caller's composite business key. */
export const KEY_MAX_BYTES = 255;
/** Operation ids chosen by workers for settlements. */
export const OPERATION_ID_MAX_BYTES = 128;
/** Error codes reported by applications. */
export const ERROR_CODE_MAX_BYTES = 128;
/** Error and failure messages: enough for a diagnosis, bounded so history and status stay small. */
export const MESSAGE_MAX_BYTES = 4 * KiB;
/** Label keys: exact-match filter keys. */
export const LABEL_KEY_MAX_BYTES = 64;
/** Label values: exact-match filter values. */
export const LABEL_VALUE_MAX_BYTES = 255;
/** Labels per task: enough to tag, few enough that every label can be indexed. */
export const MAX_LABELS = 16;
/** Callback destination aliases: operator-chosen short names. */
export const DESTINATION_ALIAS_MAX_BYTES = 64;
/** W3C `tracestate` header limit (the W3C spec's 512 characters). */
export const TRACESTATE_MAX_BYTES = 512;

// ---- HTTP ----------------------------------------------------------------------

/** Characters one byte of a path segment or query value may take once escaped (`%XX`). */
const ESCAPED_BYTE_CHARS = 3;

/**
 * The longest request target a legal call makes: a task list (`GET {scope}/tasks`) with tenant
 * and namespace at their limit, every filter at its limit (MAX_LABELS labels, queue, program,
 * workflow id, state, both bounds of 16 digits), each byte of a name escaped, and a cursor of
 * TASK_CURSOR_MAX_BYTES.
 */
export const REQUEST_TARGET_MAX_BYTES =
  '/v1/tenants//namespaces//tasks?'.length +
  2 * ESCAPED_BYTE_CHARS * SCOPE_TEXT_MAX_BYTES +
  MAX_LABELS *
    ('&label.='.length + ESCAPED_BYTE_CHARS * (LABEL_KEY_MAX_BYTES + LABEL_VALUE_MAX_BYTES)) +
  ['queue', 'program', 'workflow_id'].reduce(
    (sum, name) => sum + `&${name}=`.length + ESCAPED_BYTE_CHARS * NAME_MAX_BYTES,
    0,
  ) +
  `&state=cancelled&submitted_from=${'9'.repeat(16)}&submitted_until=${'9'.repeat(16)}&limit=500&cursor=`
    .length +
  TASK_CURSOR_MAX_BYTES;

/**
 * Maximum header block of a request, request line included (node:http's `maxHeaderSize`; past
 * it the answer is 413, reason `header_too_large`): the longest legal request target and 8 KiB
 * for every other header, rounded up to a KiB. Node's default of 16 KiB refused the second page
 * of a listing by a task's own labels at their largest (the cursor comes on top).
 */
export const REQUEST_HEADER_MAX_BYTES = Math.ceil((REQUEST_TARGET_MAX_BYTES + 8 * KiB) / KiB) * KiB;

// ---- Scheduling ---------------------------------------------------------------

/** Lowest task priority; higher runs first. */
export const PRIORITY_MIN = -100;
/** Highest task priority. */
export const PRIORITY_MAX = 100;
/** Attempts a retry policy may allow, the first included: more is a loop, not a retry. */
export const MAX_ATTEMPTS_LIMIT = 100;
/** Default attempts when a submit gives no retry policy. */
export const DEFAULT_MAX_ATTEMPTS = 3;
/** Default first retry delay. */
export const DEFAULT_RETRY_DELAY_MS = 1 * SECOND;
/** Default exponential cap. */
export const DEFAULT_RETRY_MAX_DELAY_MS = 1 * MINUTE;
/** Longest retry delay a policy may name: a retry further out than a day is a schedule, and the bound keeps deadline arithmetic exact. */
export const RETRY_MAX_DELAY_MS = 1 * DAY;
/** Default execution budget of one attempt. */
export const DEFAULT_TIMEOUT_MS = 5 * MINUTE;
/** Shortest execution budget: below a second a lease cannot be renewed even once. */
export const MIN_TIMEOUT_MS = 1 * SECOND;
/** Longest execution budget of one attempt. */
export const MAX_TIMEOUT_MS = 1 * DAY;
/** Longest submit delay (`delay_ms`, or `available_at` ahead of store time). */
export const MAX_SUBMIT_DELAY_MS = 365 * DAY;
/** Largest `concurrency_limit`: a larger limit is no limit. */
export const MAX_CONCURRENCY_LIMIT = 10_000;
/** Slots one worker session may hold. */
export const MAX_SESSION_CONCURRENCY = 1_000;
/** Commands in one `tasks:batch` request. */
export const MAX_SUBMIT_BATCH = 1_000;
/** Commands in one worker batch request (acquire, renew, settle). */
export const MAX_WORKER_BATCH = 1_000;

// ---- Leases and sessions (DESIGN §12) ---------------------------------------

/** Initial lease length: long enough to survive two missed heartbeats at the renew interval. */
export const LEASE_DURATION_MS = 30 * SECOND;
/** How often a worker heartbeats: a third of the lease, so one lost renewal is harmless. */
export const RENEW_INTERVAL_MS = 10 * SECOND;
/** Dispatch is refused when less execution budget than this remains: starting user code that cannot finish only wastes an attempt. */
export const LEASE_SAFETY_MARGIN_MS = 5 * SECOND;
/** Longest a poll or result wait parks: below common proxy idle timeouts. */
export const LONG_POLL_WAIT_MS = 20 * SECOND;
/** A worker session's validity; extended by the worker while it runs. */
export const SESSION_VALIDITY_MS = 5 * MINUTE;
/** Time after the attempt deadline for a worker to clean up and report before authority ends. */
export const CLEANUP_GRACE_MS = 30 * SECOND;
/** Deadline of one control request (acquire without wait, renew, settle) as seen by a client. */
export const CONTROL_REQUEST_TIMEOUT_MS = 10 * SECOND;

// ---- Listing and history ----------------------------------------------------

/** Page size when a list query names none. */
export const TASK_LIST_DEFAULT_LIMIT = 50;
/** Largest page size a list query may ask for. */
export const TASK_LIST_MAX_LIMIT = 500;
/** History records returned per read: large outcomes are read through result, never history. */
export const HISTORY_PAGE_LIMIT = 100;

// ---- Maintenance (DESIGN §12) ---------------------------------------------------

/** Terminal tasks are kept this long by default. */
export const TERMINAL_RETENTION_MS = 7 * DAY;
/** No retention policy may be shorter: a client must be able to read a result it was just called back about. */
export const MIN_RETENTION_MS = 1 * HOUR;
/** Maximum number of task candidates shortlisted by one recovery operation: bounds its transaction. */
export const MAX_RECOVERY_BATCH = 100;
/** Maximum rows removed by one retention transaction: never holds long locks. */
export const MAX_RETENTION_BATCH = 1_000;
/**
 * No retention policy may be longer (ten years): a bound that keeps `terminal_at − retention`
 * a safe integer and catches a unit slip (seconds given as milliseconds) at the API.
 */
export const MAX_RETENTION_MS = 3_650 * DAY;
/** Maximum records leased or completed in one maintenance operation. */
export const MAX_PUBLICATION_BATCH = 100;

// ---- Completion callbacks (DESIGN §8) ---------------------------------------

/** Subscriptions one task may have. */
export const MAX_COMPLETION_SUBSCRIPTIONS = 16;
/** Deliveries leased by one sender pass. */
export const MAX_COMPLETION_BATCH = 100;
/** How long a sender owns a leased delivery before another replica may take it. */
export const COMPLETION_LEASE_MS = 30 * SECOND;
/** Tries per delivery generation before it is `exhausted`. */
export const COMPLETION_MAX_ATTEMPTS = 12;
/** Cap of the delivery backoff. */
export const COMPLETION_MAX_RETRY_DELAY_MS = 1 * HOUR;
/** Default first delivery retry delay (`LEDGENCE_COMPLETION_RETRY_BASE_MS`). */
export const COMPLETION_RETRY_BASE_MS = 5 * SECOND;
/** Manual redelivery generations per subscription: redelivery is a repair, not a loop. */
export const COMPLETION_MAX_GENERATION = 16;
/** Response bytes a sender reads from a receiver before it stops reading. */
export const COMPLETION_RESPONSE_MAX_BYTES = 64 * KiB;

// ---- Workflows (DESIGN §9, §12; enforced when workflows land) ---------------

/** Root depth is zero; bounds cancellation paths without a tree-wide lock. */
export const WORKFLOW_MAX_DEPTH = 16;
/** Relative waits are bounded to 365 days. Zero means immediately eligible. */
export const WORKFLOW_MAX_DELAY_MS = 365 * DAY;
/** Actions in one workflow decision. */
export const WORKFLOW_MAX_COMMANDS = 64;
/** Limits simultaneous owned subworkflows, not retained historical child keys. */
export const WORKFLOW_MAX_LIVE_SUBWORKFLOWS = 64;
