-- Design b of the ready-queue probe: queued tasks found through a table of their own (inserted
-- at submit, deleted by the claim) and terminal tasks through an insert-only table, so that
-- neither `state` nor `terminal_at` appears in an index of `tasks` and its updates can be HOT.
drop index tasks_acquire;
drop index tasks_retention;
create table task_ready (tenant_id text not null, namespace text not null, queue text not null,
  priority int not null, available_at bigint not null, task_id text collate "C" not null);
create index task_ready_order on task_ready (tenant_id, namespace, queue, priority desc, available_at, task_id);
create table task_terminal (tenant_id text collate "C" not null, namespace text collate "C" not null,
  terminal_at bigint not null, task_id text not null, primary key (tenant_id, namespace, terminal_at, task_id));
