-- The write set of a Ledgence task lifecycle, set-based over batches, each step its own
-- transaction, as the store sends it (bench/probes/ready-queue/run.sh). design a: the current
-- schema; design b: design-b.sql applied (a ready-queue table, an insert-only terminal table).
create or replace procedure sim_submit(design text, n int, round int) language plpgsql as $$
declare i int := 0;
begin
  while i < n loop
    insert into tasks (tenant_id, namespace, task_id, run_id, idempotency_key, command_digest, input,
      origin_trace, queue, program, retry, timeout_ms, priority, concurrency_key, concurrency_limit,
      labels, state, submitted_at, available_at, terminal_at, attempt_count, dispatch_count,
      current_attempt_id, cancel_requested_at, outcome, history_sequence)
    select 't', 'n', 'tsk_' || round || '_' || lpad(g::text, 12, '0'), 'run_' || round || '_' || g, 'k' || round || '_' || g, null,
      '{"queue":"q","program":{"name":"noop"},"namespace":"n","tenant_id":"t"}', null, 'q',
      '{"name":"noop"}', '{"backoff":"exponential","delay_ms":1000,"max_attempts":3,"max_delay_ms":60000}',
      300000, 0, null, null, '{}', 'queued', 1000 + g, 1000 + g, null, 0, 0, null, null, null, 1
    from generate_series(i, least(i + 1000, n) - 1) g;
    insert into task_payloads select 't', 'n', 'tsk_' || round || '_' || lpad(g::text, 12, '0'), ('{"i":' || g || '}')::json, null
      from generate_series(i, least(i + 1000, n) - 1) g;
    insert into task_history select 't', 'n', 'tsk_' || round || '_' || lpad(g::text, 12, '0'), 1, null, 1000 + g, 'submitted'
      from generate_series(i, least(i + 1000, n) - 1) g;
    if design = 'b' then
      insert into task_ready select 't', 'n', 'q', 0, 1000 + g, 'tsk_' || round || '_' || lpad(g::text, 12, '0')
        from generate_series(i, least(i + 1000, n) - 1) g;
    end if;
    commit;
    i := i + 1000;
  end loop;
end $$;

create or replace procedure sim_drain(design text, batch int) language plpgsql as $$
declare ids text[]; now_ms bigint; ts timestamptz; tc interval := '0'; tr interval := '0'; tt interval := '0';
begin
  loop
    now_ms := (extract(epoch from clock_timestamp()) * 1000)::bigint;
    ts := clock_timestamp();
    -- claim
    if design = 'a' then
      select array_agg(task_id) into ids from (
        select task_id from tasks where tenant_id = 't' and namespace = 'n' and queue = 'q'
          and state = 'queued' and available_at <= now_ms
        order by priority desc nulls last, available_at, task_id limit batch for update skip locked) s;
    else
      with picked as (
        select ctid from task_ready where tenant_id = 't' and namespace = 'n' and queue = 'q'
          and available_at <= now_ms
        order by priority desc, available_at, task_id limit batch for update skip locked
      ), gone as (
        delete from task_ready r where r.ctid in (select ctid from picked) returning r.task_id
      ) select array_agg(task_id) into ids from gone;
    end if;
    exit when ids is null;
    update tasks t set state = 'active', attempt_count = 1, current_attempt_id = 'att_' || t.task_id,
      history_sequence = 2
      from unnest(ids) k(x) where t.tenant_id = 't' and t.namespace = 'n' and t.task_id = k.x;
    insert into attempts select 't', 'n', x, 'att_' || x, 1, 'lse_' || x, 1, 'ses_1', k, 'active',
      now_ms, now_ms + 300000, now_ms + 330000, now_ms + 30000, 0, null, false, 'confirmed', null, null, null, null
      from unnest(ids) with ordinality as u(x, k);
    insert into task_history select 't', 'n', x, 2, 'att_' || x, now_ms, 'claimed' from unnest(ids) x;
    insert into consumer_cursors select 't', 'n', 'ses_1', k, 1,
      '{"queue":"q","sequence":1,"consumer_id":0,"worker_session_id":"ses_1"}',
      jsonb_build_object('task_id', x, 'attempt_id', 'att_' || x)
      from unnest(ids) with ordinality as u(x, k)
      on conflict (tenant_id, namespace, worker_session_id, consumer_id) do update
        set sequence = consumer_cursors.sequence + 1, command = excluded.command, assignment = excluded.assignment;
    commit;
    tc := tc + (clock_timestamp() - ts); ts := clock_timestamp();
    -- dispatch renewal
    perform 1 from tasks t join unnest(ids) k(x) on t.tenant_id = 't' and t.namespace = 'n' and t.task_id = k.x order by t.task_id for update of t;
    update attempts a set renew_sequence = 1, dispatch_allowed = true, lease_expires_at = now_ms + 30000,
      last_renewal = '{"intent":"dispatch","sequence":1}'
      from unnest(ids) k(x) where a.tenant_id = 't' and a.namespace = 'n' and a.task_id = k.x and a.attempt_id = 'att_' || k.x;
    update tasks t set dispatch_count = 1, history_sequence = 3
      from unnest(ids) k(x) where t.tenant_id = 't' and t.namespace = 'n' and t.task_id = k.x;
    insert into task_history select 't', 'n', x, 3, 'att_' || x, now_ms, 'dispatch_authorized' from unnest(ids) x;
    commit;
    tr := tr + (clock_timestamp() - ts); ts := clock_timestamp();
    -- settle
    perform 1 from tasks t join unnest(ids) k(x) on t.tenant_id = 't' and t.namespace = 'n' and t.task_id = k.x order by t.task_id for update of t;
    update attempts a set state = 'succeeded', finished_at = now_ms,
      settlement = '{"command":{"operation_id":"op","quiescence":"confirmed","report":{"kind":"completed","report":{"outcome":{"kind":"success","output":null}}}},"receipt":{"accepted_at":1}}'
      from unnest(ids) k(x) where a.tenant_id = 't' and a.namespace = 'n' and a.task_id = k.x and a.attempt_id = 'att_' || k.x;
    update tasks t set state = 'succeeded', terminal_at = now_ms, outcome = '{"state":"succeeded"}',
      history_sequence = 5
      from unnest(ids) k(x) where t.tenant_id = 't' and t.namespace = 'n' and t.task_id = k.x;
    update task_payloads p set output = 'null'
      from unnest(ids) k(x) where p.tenant_id = 't' and p.namespace = 'n' and p.task_id = k.x;
    insert into task_history select 't', 'n', x, s, 'att_' || x, now_ms, r
      from unnest(ids) x, (values (4, 'report_accepted'), (5, 'succeeded')) v(s, r);
    if design = 'b' then
      insert into task_terminal select 't', 'n', now_ms, x from unnest(ids) x;
    end if;
    commit;
    tt := tt + (clock_timestamp() - ts);
  end loop;
  raise info 'claim % renew % settle %', tc, tr, tt;
end $$;
