--
-- PostgreSQL database dump
--

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: operation_state; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.operation_state AS ENUM (
    'waiting',
    'claimed',
    'completed',
    'failed',
    'superseded'
);

--
-- Name: resource_type; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.resource_type AS ENUM (
    'application',
    'managed_environment',
    'repository_credential',
    'sync_operation',
    'tenant'
);

--
-- Name: row_state; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.row_state AS ENUM (
    'active',
    'deleting',
    'deleted'
);

--
-- Name: signal_kind; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.signal_kind AS ENUM (
    'operations',
    'status'
);

--
-- Name: sync_operation_state; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.sync_operation_state AS ENUM (
    'pending',
    'running',
    'succeeded',
    'failed',
    'terminating',
    'terminated'
);

--
-- Name: sync_type; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.sync_type AS ENUM (
    'automated',
    'manual'
);

--
-- Name: application_state_signal(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.application_state_signal() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM signal_raise('status', 0);
    RETURN NULL;
END;
$$;

--
-- Name: application_state_stamp(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.application_state_stamp() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.seq := nextval('application_state_seq');
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END;
$$;

--
-- Name: engine_instance_front(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.engine_instance_front() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_kind text;
BEGIN
    FOREACH v_kind IN ARRAY ARRAY['front', 'floor', 'lease_floor'] LOOP
        IF TG_OP = 'INSERT' THEN
            EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I AS bigint MINVALUE 0 START 0',
                           'operation_' || v_kind || '_' || NEW.id);
        ELSE
            EXECUTE format('DROP SEQUENCE IF EXISTS %I', 'operation_' || v_kind || '_' || OLD.id);
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

--
-- Name: engine_instance_health(timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.engine_instance_health(heartbeat_at timestamp with time zone, progress_at timestamp with time zone) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE
        WHEN heartbeat_at IS NULL
          OR heartbeat_at < now() - COALESCE(NULLIF(current_setting('gitops.instance_lost_after', true), ''),
                                             '60 seconds')::interval THEN 'lost'
        WHEN progress_at IS NOT NULL
         AND progress_at < now() - COALESCE(NULLIF(current_setting('gitops.instance_degraded_after', true), ''),
                                            '90 seconds')::interval THEN 'degraded'
        ELSE 'healthy'
    END
$$;

--
-- Name: engine_instance_signal_row(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.engine_instance_signal_row() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO signal (kind, ref_id) VALUES ('operations', NEW.id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;

--
-- Name: operation_advance_front(bigint, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_advance_front(p_instance bigint, p_key bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_sequence regclass := to_regclass('operation_front_' || p_instance);
BEGIN
    IF v_sequence IS NOT NULL AND p_key > COALESCE(pg_sequence_last_value(v_sequence), 0) THEN
        PERFORM setval(v_sequence, p_key);
    END IF;
END;
$$;

--
-- Name: operation_advance_mark(text, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_advance_mark(p_kind text, p_instance bigint, p_value bigint) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_sequence regclass := to_regclass('operation_' || p_kind || '_' || p_instance);
    v_current  bigint;
BEGIN
    IF v_sequence IS NULL THEN
        RETURN 0;
    END IF;
    v_current := COALESCE(pg_sequence_last_value(v_sequence), 0);
    IF p_value > v_current THEN
        PERFORM setval(v_sequence, p_value);
        RETURN p_value;
    END IF;
    RETURN v_current;
END;
$$;

--
-- Name: operation_assign_queue_key(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_assign_queue_key() RETURNS trigger
    LANGUAGE plpgsql
    SET enable_sort TO 'off'
    AS $$
DECLARE
    v_front bigint;
    v_last  bigint;
BEGIN
    IF NEW.run_after > clock_timestamp() THEN
        NEW.queue_key := NULL;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = 'waiting' AND OLD.queue_key IS NOT NULL
       AND OLD.engine_instance_id = NEW.engine_instance_id THEN
        NEW.queue_key := OLD.queue_key;
        RETURN NEW;
    END IF;
    v_front := operation_front(NEW.engine_instance_id);
    -- The tenant's highest key: the first entry of its range of
    -- operation_tenant_last_key_idx (one entry, however long its backlog or anyone
    -- else's); only keys at or past the front, so that the walk never reaches
    -- claimed history.
    SELECT o.queue_key INTO v_last
      FROM operation o
     WHERE o.engine_instance_id = NEW.engine_instance_id
       AND o.tenant_id = NEW.tenant_id
       AND o.state = 'waiting' AND o.queue_key IS NOT NULL
       AND - o.queue_key <= - v_front
     ORDER BY - o.queue_key
     LIMIT 1;
    NEW.queue_key := GREATEST(v_front, v_last + 1);
    RETURN NEW;
END;
$$;

--
-- Name: operation_claimed_key(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_claimed_key() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.queue_key := operation_front(NEW.engine_instance_id);
    RETURN NEW;
END;
$$;

--
-- Name: operation_front(bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_front(p_instance bigint) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN COALESCE(pg_sequence_last_value(to_regclass(('operation_front_'::text || p_instance))), (0)::bigint);

--
-- Name: operation_mark(text, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_mark(p_kind text, p_instance bigint) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN COALESCE(pg_sequence_last_value(to_regclass(((('operation_'::text || p_kind) || '_'::text) || p_instance))), (0)::bigint);

--
-- Name: operation_park_while_releasing(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_park_while_releasing() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.run_after < 'infinity'
       AND EXISTS (SELECT 1 FROM tenant t WHERE t.id = NEW.tenant_id AND t.move_state = 'releasing') THEN
        NEW.run_after := 'infinity';
    END IF;
    RETURN NEW;
END;
$$;

--
-- Name: operation_safe_floor(bigint, bigint, bigint, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_safe_floor(p_instance bigint, p_from bigint, p_slack bigint, p_wait_ms integer) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_sort TO 'off'
    AS $$
DECLARE
    v_from   bigint;
    v_lowest bigint;
    v_floor  bigint;
BEGIN
    PERFORM set_config('lock_timeout', GREATEST(p_wait_ms, 1) || 'ms', true);
    PERFORM pg_advisory_xact_lock(signal_lock_key('operations', p_instance));
    -- Backoffs that ended: the key trigger gives them their place in the queue.
    UPDATE operation SET run_after = run_after
     WHERE engine_instance_id = p_instance AND state = 'waiting' AND queue_key IS NULL AND run_after <= now();
    -- The shared floor is read before the scan: only what was true before the scan's
    -- snapshot bounds what it finds.
    v_from := GREATEST(p_from, operation_mark('floor', p_instance));
    -- The first live entry from v_from on, as an ordered scan that stops there.
    SELECT LEAST(operation_front(p_instance),
                 (SELECT o.queue_key FROM operation o
                   WHERE o.engine_instance_id = p_instance AND o.state = 'waiting'
                     AND o.queue_key IS NOT NULL AND o.queue_key >= v_from
                   ORDER BY o.queue_key LIMIT 1))
      INTO v_lowest;
    v_floor := GREATEST(v_lowest - p_slack, v_from);
    PERFORM operation_advance_mark('floor', p_instance, v_floor);
    RETURN v_floor;
END;
$$;

--
-- Name: operation_signal(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.operation_signal() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM signal_raise('operations', NEW.engine_instance_id);
    RETURN NULL;
END;
$$;

--
-- Name: rollout_tenant_slot_count(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.rollout_tenant_slot_count() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    held_before boolean := TG_OP IN ('UPDATE', 'DELETE') AND OLD.active AND OLD.slot_held;
    held_after  boolean := TG_OP IN ('INSERT', 'UPDATE') AND NEW.active AND NEW.slot_held;
BEGIN
    IF held_before AND (NOT held_after OR OLD.source_instance_id <> NEW.source_instance_id) THEN
        UPDATE engine_instance SET reserved = reserved - 1 WHERE id = OLD.source_instance_id;
    END IF;
    IF held_after AND (NOT held_before OR OLD.source_instance_id <> NEW.source_instance_id) THEN
        UPDATE engine_instance SET reserved = reserved + 1 WHERE id = NEW.source_instance_id;
    END IF;
    RETURN NULL;
END;
$$;

--
-- Name: signal_channel(public.signal_kind, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.signal_channel(p_kind public.signal_kind, p_ref bigint) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ((('gitops_'::text || (p_kind)::text) || '_'::text) || (p_ref)::text);

--
-- Name: signal_lock_key(public.signal_kind, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.signal_lock_key(p_kind public.signal_kind, p_ref bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ((((103)::bigint << 56) | ((CASE p_kind WHEN 'operations'::public.signal_kind THEN 1 ELSE 2 END)::bigint << 48)) | p_ref);

--
-- Name: signal_raise(public.signal_kind, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.signal_raise(p_kind public.signal_kind, p_ref bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_sleeping boolean;
BEGIN
    -- Benchmark-only switch: measures the enqueue path without its signalling step.
    IF current_setting('gitops.bench_skip_signal', true) = 'on' THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(signal_lock_key(p_kind, p_ref));
    -- Above READ COMMITTED the read below would use the transaction's first
    -- snapshot; notifying unconditionally keeps the guarantee there.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify(signal_channel(p_kind, p_ref), '');
        RETURN;
    END IF;
    SELECT s.sleeping INTO v_sleeping FROM signal s WHERE s.kind = p_kind AND s.ref_id = p_ref;
    IF v_sleeping IS DISTINCT FROM false THEN
        PERFORM pg_notify(signal_channel(p_kind, p_ref), '');
    END IF;
END;
$$;

--
-- Name: state_writer_shard(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.state_writer_shard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.writer_shard := (SELECT writer_shard FROM tenant WHERE id = NEW.tenant_id);
    RETURN NEW;
END;
$$;

--
-- Name: status_retry_delay(integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.status_retry_delay(p_attempts integer) RETURNS interval
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN make_interval(secs => LEAST((60)::double precision, power((2)::double precision, (LEAST((GREATEST(p_attempts, 1) - 1), 6))::double precision)));

--
-- Name: tenant_placement_count(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.tenant_placement_count() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.engine_instance_id IS NOT NULL
       AND (TG_OP = 'DELETE' OR OLD.engine_instance_id IS DISTINCT FROM NEW.engine_instance_id) THEN
        UPDATE engine_instance SET tenants = tenants - 1 WHERE id = OLD.engine_instance_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.engine_instance_id IS NOT NULL
       AND (TG_OP = 'INSERT' OR OLD.engine_instance_id IS DISTINCT FROM NEW.engine_instance_id) THEN
        -- Back on a source that held its slot: the slot becomes the tenant's.
        UPDATE rollout_tenant SET slot_held = false
         WHERE tenant_id = NEW.id AND source_instance_id = NEW.engine_instance_id AND active AND slot_held;
        IF FOUND THEN
            UPDATE engine_instance SET tenants = tenants + 1 WHERE id = NEW.engine_instance_id;
        ELSE
            UPDATE engine_instance SET tenants = tenants + 1
             WHERE id = NEW.engine_instance_id AND tenants + reserved < capacity;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'engine instance % is full', NEW.engine_instance_id
                    USING ERRCODE = 'serialization_failure', CONSTRAINT = 'engine_instance_capacity';
            END IF;
        END IF;
        -- The instance's row is locked now: a rollout started meanwhile is seen.
        IF COALESCE(NEW.move_reason, '') NOT IN ('rollout', 'rollback')
           AND EXISTS (SELECT 1 FROM rollout r WHERE r.target_instance_id = NEW.engine_instance_id
                          AND r.state IN ('moving', 'baking', 'waiting', 'rolling_back')) THEN
            RAISE EXCEPTION 'engine instance % is the target of a rollout and takes no other tenants',
                NEW.engine_instance_id
                USING ERRCODE = 'serialization_failure', CONSTRAINT = 'engine_instance_rollout_target';
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

--
-- Name: tenant_writer_shard_moved(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.tenant_writer_shard_moved() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE application_state SET updated_at = now() WHERE tenant_id = NEW.id;
    UPDATE resource_state SET updated_at = now() WHERE tenant_id = NEW.id;
    RETURN NULL;
END;
$$;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: admission_approval; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.admission_approval (
    resource_uid uuid NOT NULL,
    generation bigint NOT NULL,
    kind text NOT NULL,
    requester text NOT NULL,
    approved_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT admission_approval_kind_check CHECK ((kind = ANY (ARRAY['GitOpsDeployment'::text, 'GitOpsDeploymentSyncRun'::text])))
);

--
-- Name: application; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.application (
    id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    resource_uid uuid NOT NULL,
    resource_name text NOT NULL,
    generation bigint NOT NULL,
    repo_url text NOT NULL,
    path text NOT NULL,
    target_revision text DEFAULT 'HEAD'::text NOT NULL,
    managed_environment_id bigint,
    destination_namespace text NOT NULL,
    sync_type public.sync_type NOT NULL,
    create_namespace boolean DEFAULT false NOT NULL,
    wait_for_pruning boolean DEFAULT false NOT NULL,
    row_state public.row_state DEFAULT 'active'::public.row_state NOT NULL,
    deletion_message text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: application_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.application ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.application_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: application_state_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.application_state_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: application_state; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.application_state (
    application_id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    sync_status text,
    sync_revision text,
    health_status text,
    health_message text,
    resources jsonb DEFAULT '[]'::jsonb NOT NULL,
    conditions jsonb DEFAULT '[]'::jsonb NOT NULL,
    operation_state jsonb,
    reconciled_state jsonb,
    seq bigint DEFAULT nextval('public.application_state_seq'::regclass) NOT NULL,
    changed_xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    applied_generation bigint,
    agent_message text,
    agent_stalled boolean DEFAULT false NOT NULL,
    stalled_generation bigint,
    writer_shard integer
);

--
-- Name: cluster_credential; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.cluster_credential (
    id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    managed_environment_id bigint NOT NULL,
    secret_name text NOT NULL,
    secret_resource_version text,
    key_id text NOT NULL,
    ciphertext bytea NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone
);

--
-- Name: cluster_credential_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.cluster_credential ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.cluster_credential_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: engine_instance; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.engine_instance (
    id bigint NOT NULL,
    name text NOT NULL,
    argocd_namespace text NOT NULL,
    capacity integer DEFAULT 1000 NOT NULL,
    heartbeat_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    tenants integer DEFAULT 0 NOT NULL,
    cordoned boolean DEFAULT false NOT NULL,
    progress_at timestamp with time zone,
    epoch bigint DEFAULT 0 NOT NULL,
    fenced_at timestamp with time zone,
    tracking_method text,
    instance_label_key text,
    installation_id text,
    argocd_version text,
    version_reported_at timestamp with time zone,
    host_cluster text,
    provisioned_by text,
    reserved integer DEFAULT 0 NOT NULL,
    CONSTRAINT engine_instance_argocd_namespace_check CHECK ((argocd_namespace ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'::text)),
    CONSTRAINT engine_instance_capacity_check CHECK ((capacity > 0)),
    CONSTRAINT engine_instance_host_cluster_check CHECK ((host_cluster ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'::text)),
    CONSTRAINT engine_instance_name_check CHECK ((name ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'::text)),
    CONSTRAINT engine_instance_provisioned_by_check CHECK ((provisioned_by = ANY (ARRAY['gitopsctl'::text, 'scale-up'::text]))),
    CONSTRAINT engine_instance_reserved_check CHECK ((reserved >= 0))
);

--
-- Name: engine_instance_duty; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.engine_instance_duty (
    engine_instance_id bigint NOT NULL,
    holder text NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    acquired_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: engine_instance_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.engine_instance ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.engine_instance_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: instance_scale_up; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.instance_scale_up (
    id bigint NOT NULL,
    instance_name text NOT NULL,
    state text DEFAULT 'provisioning'::text NOT NULL,
    holder text NOT NULL,
    free_capacity bigint NOT NULL,
    error text,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT instance_scale_up_state_check CHECK ((state = ANY (ARRAY['provisioning'::text, 'completed'::text, 'failed'::text])))
);

--
-- Name: instance_scale_up_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.instance_scale_up ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.instance_scale_up_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: managed_environment; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.managed_environment (
    id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    resource_uid uuid NOT NULL,
    resource_name text NOT NULL,
    generation bigint NOT NULL,
    api_url text NOT NULL,
    allow_insecure_skip_tls_verify boolean DEFAULT false NOT NULL,
    namespaces text[] DEFAULT '{}'::text[] NOT NULL,
    cluster_resources boolean DEFAULT false NOT NULL,
    row_state public.row_state DEFAULT 'active'::public.row_state NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    home boolean DEFAULT false NOT NULL,
    home_revoke_requested_at timestamp with time zone
);

--
-- Name: managed_environment_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.managed_environment ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.managed_environment_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: operation; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.operation (
    id bigint NOT NULL,
    engine_instance_id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    resource_type public.resource_type NOT NULL,
    resource_id bigint NOT NULL,
    state public.operation_state DEFAULT 'waiting'::public.operation_state NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    claimed_by text,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    claimed_at timestamp with time zone,
    completed_at timestamp with time zone,
    operator_error text,
    tenant_message text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    lease_expiries integer DEFAULT 0 NOT NULL,
    queue_key bigint,
    CONSTRAINT operation_check CHECK (((state <> 'claimed'::public.operation_state) OR ((lease_token IS NOT NULL) AND (lease_expires_at IS NOT NULL))))
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_analyze_scale_factor='0.05');

--
-- Name: operation_history; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.operation_history (
    id bigint NOT NULL,
    engine_instance_id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    resource_type public.resource_type NOT NULL,
    resource_id bigint NOT NULL,
    state public.operation_state NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    lease_expiries integer DEFAULT 0 NOT NULL,
    claimed_by text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    claimed_at timestamp with time zone,
    completed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    operator_error text,
    CONSTRAINT operation_history_state_check CHECK ((state = ANY (ARRAY['completed'::public.operation_state, 'superseded'::public.operation_state])))
);

--
-- Name: operation_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.operation ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.operation_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: operation_log; Type: VIEW; Schema: public; Owner: -
--

CREATE VIEW public.operation_log AS
 SELECT operation.id,
    operation.engine_instance_id,
    operation.tenant_id,
    operation.resource_type,
    operation.resource_id,
    operation.state,
    operation.attempts,
    operation.lease_expiries,
    operation.claimed_by,
    operation.created_at,
    operation.claimed_at,
    operation.completed_at,
    operation.operator_error,
    operation.tenant_message,
    operation.run_after,
    operation.lease_token,
    operation.lease_expires_at,
    operation.queue_key
   FROM public.operation
UNION ALL
 SELECT operation_history.id,
    operation_history.engine_instance_id,
    operation_history.tenant_id,
    operation_history.resource_type,
    operation_history.resource_id,
    operation_history.state,
    operation_history.attempts,
    operation_history.lease_expiries,
    operation_history.claimed_by,
    operation_history.created_at,
    operation_history.claimed_at,
    operation_history.completed_at,
    operation_history.operator_error,
    NULL::text AS tenant_message,
    NULL::timestamp with time zone AS run_after,
    NULL::uuid AS lease_token,
    NULL::timestamp with time zone AS lease_expires_at,
    NULL::bigint AS queue_key
   FROM public.operation_history;

--
-- Name: refinery_schema_history; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.refinery_schema_history (
    version integer NOT NULL,
    name character varying(255),
    applied_on character varying(255),
    checksum character varying(255)
);

--
-- Name: repository_credential; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.repository_credential (
    id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    resource_uid uuid NOT NULL,
    resource_name text NOT NULL,
    generation bigint NOT NULL,
    repo_url text NOT NULL,
    secret_name text NOT NULL,
    secret_resource_version text,
    key_id text,
    ciphertext bytea,
    row_state public.row_state DEFAULT 'active'::public.row_state NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT repository_credential_check CHECK (((key_id IS NULL) = (ciphertext IS NULL)))
);

--
-- Name: repository_credential_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.repository_credential ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.repository_credential_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: resource_state; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.resource_state (
    managed_environment_id bigint,
    repository_credential_id bigint,
    tenant_id bigint NOT NULL,
    applied_generation bigint,
    agent_message text,
    agent_stalled boolean DEFAULT false NOT NULL,
    stalled_generation bigint,
    seq bigint DEFAULT nextval('public.application_state_seq'::regclass) NOT NULL,
    changed_xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    writer_shard integer,
    CONSTRAINT resource_state_check CHECK ((num_nonnulls(managed_environment_id, repository_credential_id) = 1))
);

--
-- Name: rollout; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rollout (
    id bigint NOT NULL,
    target_instance_id bigint NOT NULL,
    target_version text,
    state text DEFAULT 'moving'::text NOT NULL,
    wave integer DEFAULT 0 NOT NULL,
    promoting boolean DEFAULT false NOT NULL,
    wave_size integer NOT NULL,
    bake_ms bigint NOT NULL,
    max_regressions integer,
    bake_until timestamp with time zone,
    outcome text,
    reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT rollout_bake_ms_check CHECK ((bake_ms >= 0)),
    CONSTRAINT rollout_max_regressions_check CHECK ((max_regressions >= 0)),
    CONSTRAINT rollout_outcome_check CHECK ((outcome = ANY (ARRAY['rolled_back'::text, 'aborted'::text]))),
    CONSTRAINT rollout_rolling_back_has_outcome CHECK (((state = 'rolling_back'::text) <= (outcome IS NOT NULL))),
    CONSTRAINT rollout_state_check CHECK ((state = ANY (ARRAY['moving'::text, 'baking'::text, 'waiting'::text, 'rolling_back'::text, 'completed'::text, 'rolled_back'::text, 'aborted'::text]))),
    CONSTRAINT rollout_wave_size_check CHECK ((wave_size > 0))
);

--
-- Name: rollout_baseline; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rollout_baseline (
    rollout_id bigint NOT NULL,
    application_id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    wave integer NOT NULL,
    generation bigint NOT NULL,
    health_status text,
    sync_status text,
    comparison_error boolean NOT NULL,
    sync_failed boolean NOT NULL,
    verdict text,
    detail text,
    CONSTRAINT rollout_baseline_verdict_check CHECK ((verdict = ANY (ARRAY['ok'::text, 'regressed'::text, 'excluded'::text])))
);

--
-- Name: rollout_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.rollout ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.rollout_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: rollout_tenant; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.rollout_tenant (
    rollout_id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    wave integer NOT NULL,
    source_instance_id bigint NOT NULL,
    state text DEFAULT 'moving'::text NOT NULL,
    active boolean DEFAULT true NOT NULL,
    slot_held boolean DEFAULT true NOT NULL,
    CONSTRAINT rollout_tenant_state_check CHECK ((state = ANY (ARRAY['moving'::text, 'moved'::text, 'returning'::text, 'returned'::text])))
);

--
-- Name: signal; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.signal (
    kind public.signal_kind NOT NULL,
    ref_id bigint NOT NULL,
    sleeping boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT signal_ref_id_check CHECK (((ref_id >= 0) AND (ref_id < '281474976710656'::bigint)))
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000');

--
-- Name: status_retry; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.status_retry (
    kind text NOT NULL,
    row_id bigint NOT NULL,
    shard integer NOT NULL,
    attempts integer DEFAULT 1 NOT NULL,
    due_at timestamp with time zone NOT NULL,
    last_error text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT status_retry_kind_check CHECK ((kind = ANY (ARRAY['application'::text, 'managed_environment'::text, 'repository_credential'::text])))
);

--
-- Name: sync_operation; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.sync_operation (
    id bigint NOT NULL,
    tenant_id bigint NOT NULL,
    resource_uid uuid NOT NULL,
    resource_name text NOT NULL,
    generation bigint NOT NULL,
    deployment_name text NOT NULL,
    application_id bigint,
    revision text NOT NULL,
    correlation_id uuid DEFAULT gen_random_uuid() NOT NULL,
    state public.sync_operation_state DEFAULT 'pending'::public.sync_operation_state NOT NULL,
    terminate_requested boolean DEFAULT false NOT NULL,
    synced_revision text,
    message text,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    row_state public.row_state DEFAULT 'active'::public.row_state NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    failure_reason text
);

--
-- Name: sync_operation_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.sync_operation ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.sync_operation_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: tenant; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.tenant (
    id bigint NOT NULL,
    namespace_uid uuid NOT NULL,
    namespace_name text NOT NULL,
    engine_instance_id bigint,
    row_state public.row_state DEFAULT 'active'::public.row_state NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    writer_shard integer,
    moving_from bigint,
    move_state text,
    move_started_at timestamp with time zone,
    move_reason text,
    CONSTRAINT tenant_move_check CHECK (((move_state IS NULL) = (moving_from IS NULL))),
    CONSTRAINT tenant_move_state_check CHECK ((move_state = ANY (ARRAY['releasing'::text, 'adopting'::text])))
);

--
-- Name: tenant_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.tenant ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.tenant_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: writer_shard; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.writer_shard (
    shard integer NOT NULL,
    writer_id text,
    lease_expires_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    status_xid xid8 DEFAULT '0'::xid8 NOT NULL,
    CONSTRAINT writer_shard_check CHECK (((writer_id IS NULL) = (lease_expires_at IS NULL))),
    CONSTRAINT writer_shard_shard_check CHECK ((shard >= 0))
);

--
-- Name: admission_approval admission_approval_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.admission_approval
    ADD CONSTRAINT admission_approval_pkey PRIMARY KEY (resource_uid, generation);

--
-- Name: application application_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.application
    ADD CONSTRAINT application_pkey PRIMARY KEY (id);

--
-- Name: application application_resource_uid_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.application
    ADD CONSTRAINT application_resource_uid_key UNIQUE (resource_uid);

--
-- Name: application_state application_state_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.application_state
    ADD CONSTRAINT application_state_pkey PRIMARY KEY (application_id);

--
-- Name: cluster_credential cluster_credential_managed_environment_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.cluster_credential
    ADD CONSTRAINT cluster_credential_managed_environment_id_key UNIQUE (managed_environment_id);

--
-- Name: cluster_credential cluster_credential_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.cluster_credential
    ADD CONSTRAINT cluster_credential_pkey PRIMARY KEY (id);

--
-- Name: engine_instance_duty engine_instance_duty_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.engine_instance_duty
    ADD CONSTRAINT engine_instance_duty_pkey PRIMARY KEY (engine_instance_id);

--
-- Name: engine_instance engine_instance_name_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.engine_instance
    ADD CONSTRAINT engine_instance_name_key UNIQUE (name);

--
-- Name: engine_instance engine_instance_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.engine_instance
    ADD CONSTRAINT engine_instance_pkey PRIMARY KEY (id);

--
-- Name: instance_scale_up instance_scale_up_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.instance_scale_up
    ADD CONSTRAINT instance_scale_up_pkey PRIMARY KEY (id);

--
-- Name: managed_environment managed_environment_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.managed_environment
    ADD CONSTRAINT managed_environment_pkey PRIMARY KEY (id);

--
-- Name: managed_environment managed_environment_resource_uid_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.managed_environment
    ADD CONSTRAINT managed_environment_resource_uid_key UNIQUE (resource_uid);

--
-- Name: operation_history operation_history_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.operation_history
    ADD CONSTRAINT operation_history_pkey PRIMARY KEY (id);

--
-- Name: operation operation_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.operation
    ADD CONSTRAINT operation_pkey PRIMARY KEY (id);

--
-- Name: refinery_schema_history refinery_schema_history_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.refinery_schema_history
    ADD CONSTRAINT refinery_schema_history_pkey PRIMARY KEY (version);

--
-- Name: repository_credential repository_credential_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.repository_credential
    ADD CONSTRAINT repository_credential_pkey PRIMARY KEY (id);

--
-- Name: repository_credential repository_credential_resource_uid_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.repository_credential
    ADD CONSTRAINT repository_credential_resource_uid_key UNIQUE (resource_uid);

--
-- Name: resource_state resource_state_managed_environment_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.resource_state
    ADD CONSTRAINT resource_state_managed_environment_id_key UNIQUE (managed_environment_id);

--
-- Name: resource_state resource_state_repository_credential_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.resource_state
    ADD CONSTRAINT resource_state_repository_credential_id_key UNIQUE (repository_credential_id);

--
-- Name: rollout_baseline rollout_baseline_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout_baseline
    ADD CONSTRAINT rollout_baseline_pkey PRIMARY KEY (rollout_id, application_id);

--
-- Name: rollout rollout_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout
    ADD CONSTRAINT rollout_pkey PRIMARY KEY (id);

--
-- Name: rollout_tenant rollout_tenant_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout_tenant
    ADD CONSTRAINT rollout_tenant_pkey PRIMARY KEY (rollout_id, tenant_id);

--
-- Name: signal signal_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.signal
    ADD CONSTRAINT signal_pkey PRIMARY KEY (kind, ref_id);

--
-- Name: status_retry status_retry_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.status_retry
    ADD CONSTRAINT status_retry_pkey PRIMARY KEY (kind, row_id);

--
-- Name: sync_operation sync_operation_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sync_operation
    ADD CONSTRAINT sync_operation_pkey PRIMARY KEY (id);

--
-- Name: sync_operation sync_operation_resource_uid_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sync_operation
    ADD CONSTRAINT sync_operation_resource_uid_key UNIQUE (resource_uid);

--
-- Name: tenant tenant_namespace_uid_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tenant
    ADD CONSTRAINT tenant_namespace_uid_key UNIQUE (namespace_uid);

--
-- Name: tenant tenant_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tenant
    ADD CONSTRAINT tenant_pkey PRIMARY KEY (id);

--
-- Name: writer_shard writer_shard_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.writer_shard
    ADD CONSTRAINT writer_shard_pkey PRIMARY KEY (shard);

--
-- Name: admission_approval_age_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX admission_approval_age_idx ON public.admission_approval USING btree (approved_at);

--
-- Name: application_environment_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX application_environment_idx ON public.application USING btree (managed_environment_id) WHERE (managed_environment_id IS NOT NULL);

--
-- Name: application_state_seq_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX application_state_seq_idx ON public.application_state USING btree (seq);

--
-- Name: application_state_shard_xid_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX application_state_shard_xid_idx ON public.application_state USING btree (writer_shard, changed_xid, seq);

--
-- Name: application_state_tenant_xid_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX application_state_tenant_xid_idx ON public.application_state USING btree (tenant_id, changed_xid);

--
-- Name: application_tenant_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX application_tenant_idx ON public.application USING btree (tenant_id);

--
-- Name: cluster_credential_expires_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cluster_credential_expires_idx ON public.cluster_credential USING btree (expires_at) WHERE (expires_at IS NOT NULL);

--
-- Name: cluster_credential_tenant_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX cluster_credential_tenant_idx ON public.cluster_credential USING btree (tenant_id);

--
-- Name: engine_instance_host_cluster; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX engine_instance_host_cluster ON public.engine_instance USING btree (host_cluster) WHERE (host_cluster IS NOT NULL);

--
-- Name: instance_scale_up_one_at_a_time; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX instance_scale_up_one_at_a_time ON public.instance_scale_up USING btree ((true)) WHERE (state = 'provisioning'::text);

--
-- Name: managed_environment_home_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX managed_environment_home_idx ON public.managed_environment USING btree (tenant_id) WHERE (home AND (row_state = 'active'::public.row_state));

--
-- Name: managed_environment_home_revoke_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX managed_environment_home_revoke_idx ON public.managed_environment USING btree (home_revoke_requested_at) WHERE (home_revoke_requested_at IS NOT NULL);

--
-- Name: managed_environment_tenant_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX managed_environment_tenant_idx ON public.managed_environment USING btree (tenant_id);

--
-- Name: operation_claim_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX operation_claim_idx ON public.operation USING btree (engine_instance_id, queue_key, id) WHERE ((state = 'waiting'::public.operation_state) AND (queue_key IS NOT NULL));

--
-- Name: operation_claimed_key_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX operation_claimed_key_idx ON public.operation USING btree (engine_instance_id, queue_key) WHERE ((state = 'claimed'::public.operation_state) AND (queue_key IS NOT NULL));

--
-- Name: operation_delayed_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX operation_delayed_idx ON public.operation USING btree (engine_instance_id, run_after) WHERE ((state = 'waiting'::public.operation_state) AND (queue_key IS NULL));

--
-- Name: operation_failed_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX operation_failed_idx ON public.operation USING btree (engine_instance_id, completed_at) WHERE (state = 'failed'::public.operation_state);

--
-- Name: operation_history_completed_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX operation_history_completed_idx ON public.operation_history USING btree (completed_at);

--
-- Name: operation_one_claimed_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX operation_one_claimed_idx ON public.operation USING btree (resource_type, resource_id) WHERE (state = 'claimed'::public.operation_state);

--
-- Name: operation_one_waiting_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX operation_one_waiting_idx ON public.operation USING btree (resource_type, resource_id) WHERE (state = 'waiting'::public.operation_state);

--
-- Name: operation_prune_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX operation_prune_idx ON public.operation USING btree (completed_at) WHERE (state = ANY (ARRAY['completed'::public.operation_state, 'superseded'::public.operation_state]));

--
-- Name: operation_tenant_last_key_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX operation_tenant_last_key_idx ON public.operation USING btree (engine_instance_id, tenant_id, ((- queue_key))) WHERE ((state = 'waiting'::public.operation_state) AND (queue_key IS NOT NULL));

--
-- Name: repository_credential_tenant_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX repository_credential_tenant_idx ON public.repository_credential USING btree (tenant_id);

--
-- Name: resource_state_shard_xid_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX resource_state_shard_xid_idx ON public.resource_state USING btree (writer_shard, changed_xid, seq);

--
-- Name: resource_state_tenant_xid_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX resource_state_tenant_xid_idx ON public.resource_state USING btree (tenant_id, changed_xid);

--
-- Name: rollout_active_target; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX rollout_active_target ON public.rollout USING btree (target_instance_id) WHERE (state = ANY (ARRAY['moving'::text, 'baking'::text, 'waiting'::text, 'rolling_back'::text]));

--
-- Name: rollout_tenant_held_slot; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX rollout_tenant_held_slot ON public.rollout_tenant USING btree (tenant_id, source_instance_id) WHERE (active AND slot_held);

--
-- Name: rollout_tenant_one_rollout; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX rollout_tenant_one_rollout ON public.rollout_tenant USING btree (tenant_id) WHERE active;

--
-- Name: status_retry_shard_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX status_retry_shard_idx ON public.status_retry USING btree (shard, due_at);

--
-- Name: sync_operation_application_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX sync_operation_application_idx ON public.sync_operation USING btree (application_id);

--
-- Name: sync_operation_tenant_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX sync_operation_tenant_idx ON public.sync_operation USING btree (tenant_id);

--
-- Name: tenant_engine_instance_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX tenant_engine_instance_idx ON public.tenant USING btree (engine_instance_id);

--
-- Name: tenant_namespace_name_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX tenant_namespace_name_idx ON public.tenant USING btree (namespace_name);

--
-- Name: tenant_writer_shard_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX tenant_writer_shard_idx ON public.tenant USING btree (writer_shard);

--
-- Name: application_state application_state_signal; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER application_state_signal AFTER INSERT OR UPDATE ON public.application_state FOR EACH STATEMENT EXECUTE FUNCTION public.application_state_signal();

--
-- Name: application_state application_state_stamp; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER application_state_stamp BEFORE UPDATE ON public.application_state FOR EACH ROW EXECUTE FUNCTION public.application_state_stamp();

--
-- Name: application_state application_state_writer_shard; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER application_state_writer_shard BEFORE INSERT OR UPDATE ON public.application_state FOR EACH ROW EXECUTE FUNCTION public.state_writer_shard();

--
-- Name: engine_instance engine_instance_front; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER engine_instance_front AFTER INSERT OR DELETE ON public.engine_instance FOR EACH ROW EXECUTE FUNCTION public.engine_instance_front();

--
-- Name: engine_instance engine_instance_signal_row; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER engine_instance_signal_row AFTER INSERT ON public.engine_instance FOR EACH ROW EXECUTE FUNCTION public.engine_instance_signal_row();

--
-- Name: operation operation_claimed_key; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER operation_claimed_key BEFORE INSERT OR UPDATE ON public.operation FOR EACH ROW WHEN (((new.state = 'claimed'::public.operation_state) AND (new.queue_key IS NULL))) EXECUTE FUNCTION public.operation_claimed_key();

--
-- Name: operation operation_park_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER operation_park_insert BEFORE INSERT ON public.operation FOR EACH ROW WHEN (((new.state = 'waiting'::public.operation_state) AND (new.resource_type <> 'tenant'::public.resource_type))) EXECUTE FUNCTION public.operation_park_while_releasing();

--
-- Name: operation operation_park_update; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER operation_park_update BEFORE UPDATE OF state, run_after, engine_instance_id ON public.operation FOR EACH ROW WHEN (((new.state = 'waiting'::public.operation_state) AND (new.resource_type <> 'tenant'::public.resource_type))) EXECUTE FUNCTION public.operation_park_while_releasing();

--
-- Name: operation operation_queue_key_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER operation_queue_key_insert BEFORE INSERT ON public.operation FOR EACH ROW WHEN ((new.state = 'waiting'::public.operation_state)) EXECUTE FUNCTION public.operation_assign_queue_key();

--
-- Name: operation operation_queue_key_update; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER operation_queue_key_update BEFORE UPDATE OF state, run_after, engine_instance_id ON public.operation FOR EACH ROW WHEN ((new.state = 'waiting'::public.operation_state)) EXECUTE FUNCTION public.operation_assign_queue_key();

--
-- Name: operation operation_signal_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER operation_signal_insert AFTER INSERT ON public.operation FOR EACH ROW WHEN ((new.state = 'waiting'::public.operation_state)) EXECUTE FUNCTION public.operation_signal();

--
-- Name: operation operation_signal_update; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER operation_signal_update AFTER UPDATE OF state, run_after ON public.operation FOR EACH ROW WHEN (((new.state = 'waiting'::public.operation_state) AND (new.run_after <= now()))) EXECUTE FUNCTION public.operation_signal();

--
-- Name: resource_state resource_state_signal; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER resource_state_signal AFTER INSERT OR UPDATE ON public.resource_state FOR EACH STATEMENT EXECUTE FUNCTION public.application_state_signal();

--
-- Name: resource_state resource_state_stamp; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER resource_state_stamp BEFORE UPDATE ON public.resource_state FOR EACH ROW EXECUTE FUNCTION public.application_state_stamp();

--
-- Name: resource_state resource_state_writer_shard; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER resource_state_writer_shard BEFORE INSERT OR UPDATE ON public.resource_state FOR EACH ROW EXECUTE FUNCTION public.state_writer_shard();

--
-- Name: rollout_tenant rollout_tenant_slot_count; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER rollout_tenant_slot_count AFTER INSERT OR DELETE OR UPDATE OF active, slot_held, source_instance_id ON public.rollout_tenant FOR EACH ROW EXECUTE FUNCTION public.rollout_tenant_slot_count();

--
-- Name: tenant tenant_placement_count; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER tenant_placement_count AFTER INSERT OR DELETE OR UPDATE OF engine_instance_id ON public.tenant FOR EACH ROW EXECUTE FUNCTION public.tenant_placement_count();

--
-- Name: tenant tenant_writer_shard_moved; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER tenant_writer_shard_moved AFTER UPDATE OF writer_shard ON public.tenant FOR EACH ROW WHEN ((old.writer_shard IS DISTINCT FROM new.writer_shard)) EXECUTE FUNCTION public.tenant_writer_shard_moved();

--
-- Name: application application_managed_environment_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.application
    ADD CONSTRAINT application_managed_environment_id_fkey FOREIGN KEY (managed_environment_id) REFERENCES public.managed_environment(id);

--
-- Name: application_state application_state_application_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.application_state
    ADD CONSTRAINT application_state_application_id_fkey FOREIGN KEY (application_id) REFERENCES public.application(id) ON DELETE CASCADE;

--
-- Name: application_state application_state_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.application_state
    ADD CONSTRAINT application_state_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenant(id);

--
-- Name: application application_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.application
    ADD CONSTRAINT application_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenant(id);

--
-- Name: cluster_credential cluster_credential_managed_environment_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.cluster_credential
    ADD CONSTRAINT cluster_credential_managed_environment_id_fkey FOREIGN KEY (managed_environment_id) REFERENCES public.managed_environment(id) ON DELETE CASCADE;

--
-- Name: cluster_credential cluster_credential_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.cluster_credential
    ADD CONSTRAINT cluster_credential_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenant(id);

--
-- Name: engine_instance_duty engine_instance_duty_engine_instance_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.engine_instance_duty
    ADD CONSTRAINT engine_instance_duty_engine_instance_id_fkey FOREIGN KEY (engine_instance_id) REFERENCES public.engine_instance(id) ON DELETE CASCADE;

--
-- Name: managed_environment managed_environment_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.managed_environment
    ADD CONSTRAINT managed_environment_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenant(id);

--
-- Name: operation operation_engine_instance_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.operation
    ADD CONSTRAINT operation_engine_instance_id_fkey FOREIGN KEY (engine_instance_id) REFERENCES public.engine_instance(id);

--
-- Name: repository_credential repository_credential_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.repository_credential
    ADD CONSTRAINT repository_credential_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenant(id);

--
-- Name: resource_state resource_state_managed_environment_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.resource_state
    ADD CONSTRAINT resource_state_managed_environment_id_fkey FOREIGN KEY (managed_environment_id) REFERENCES public.managed_environment(id) ON DELETE CASCADE;

--
-- Name: resource_state resource_state_repository_credential_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.resource_state
    ADD CONSTRAINT resource_state_repository_credential_id_fkey FOREIGN KEY (repository_credential_id) REFERENCES public.repository_credential(id) ON DELETE CASCADE;

--
-- Name: resource_state resource_state_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.resource_state
    ADD CONSTRAINT resource_state_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenant(id);

--
-- Name: rollout_baseline rollout_baseline_application_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout_baseline
    ADD CONSTRAINT rollout_baseline_application_id_fkey FOREIGN KEY (application_id) REFERENCES public.application(id) ON DELETE CASCADE;

--
-- Name: rollout_baseline rollout_baseline_rollout_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout_baseline
    ADD CONSTRAINT rollout_baseline_rollout_id_fkey FOREIGN KEY (rollout_id) REFERENCES public.rollout(id) ON DELETE CASCADE;

--
-- Name: rollout rollout_target_instance_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout
    ADD CONSTRAINT rollout_target_instance_id_fkey FOREIGN KEY (target_instance_id) REFERENCES public.engine_instance(id) ON DELETE CASCADE;

--
-- Name: rollout_tenant rollout_tenant_rollout_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout_tenant
    ADD CONSTRAINT rollout_tenant_rollout_id_fkey FOREIGN KEY (rollout_id) REFERENCES public.rollout(id) ON DELETE CASCADE;

--
-- Name: rollout_tenant rollout_tenant_source_instance_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout_tenant
    ADD CONSTRAINT rollout_tenant_source_instance_id_fkey FOREIGN KEY (source_instance_id) REFERENCES public.engine_instance(id) ON DELETE CASCADE;

--
-- Name: rollout_tenant rollout_tenant_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.rollout_tenant
    ADD CONSTRAINT rollout_tenant_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenant(id) ON DELETE CASCADE;

--
-- Name: sync_operation sync_operation_application_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sync_operation
    ADD CONSTRAINT sync_operation_application_id_fkey FOREIGN KEY (application_id) REFERENCES public.application(id);

--
-- Name: sync_operation sync_operation_tenant_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sync_operation
    ADD CONSTRAINT sync_operation_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenant(id);

--
-- Name: tenant tenant_engine_instance_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tenant
    ADD CONSTRAINT tenant_engine_instance_id_fkey FOREIGN KEY (engine_instance_id) REFERENCES public.engine_instance(id);

--
-- Name: tenant tenant_moving_from_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.tenant
    ADD CONSTRAINT tenant_moving_from_fkey FOREIGN KEY (moving_from) REFERENCES public.engine_instance(id);

--
-- PostgreSQL database dump complete
--

