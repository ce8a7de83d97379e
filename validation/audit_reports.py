"""The audit's preset reports: plain SQL over the views of audit_views.py, in one dict.

Copy any of them into `gristmill data audit DIR --sql "…"` (or the duckdb CLI on a `--db` file)
and change it. Every report is per `dataset_name`, so auditing two builds compares them.
"""

from __future__ import annotations

PRESETS: dict[str, str] = {
    # The funnel: documents read (datatrove's reader stats), dropped by each filter in pipeline
    # order (datatrove's filter stats; `dedup` is the filter that drops duplicates; the tokenize
    # step's `no_tokens`: texts its tokenizer encodes to nothing), kept
    # (manifest rows) with their tokens, what the tokenize step itself counted, the excluded/ rows,
    # and the shards. Only the build's own pass (pipeline ''): dedup's first pass reads the input
    # too and runs the same filters (its stats are under logs/dedup/<stage>/).
    "summary": """
WITH read AS (
    SELECT dataset_name, sum(value)::BIGINT AS n FROM stats
    WHERE step_type = 'READER' AND metric = 'documents' AND pipeline = '' GROUP BY ALL
), funnel AS (
    SELECT dataset_name, 1 AS ord, 0 AS step, 'read' AS item, n AS documents, NULL::BIGINT AS tokens FROM read
    UNION ALL
    SELECT dataset_name, 2, step, 'dropped by ' || step_name, sum(value)::BIGINT, NULL FROM stats
    WHERE step_type = 'FILTER' AND metric = 'dropped' AND pipeline = '' GROUP BY ALL
    UNION ALL
    SELECT dataset_name, 2, step, 'dropped by tokens (encoded to no token, or to the unknown token)',
           sum(value)::BIGINT, NULL
    FROM stats WHERE metric IN ('no_tokens', 'unknown_tokens') AND pipeline = '' GROUP BY ALL
    UNION ALL
    SELECT dataset_name, 3, 0, 'kept (manifest)', count(*), sum(n_tokens) FROM docs GROUP BY ALL
    UNION ALL
    SELECT s.dataset_name, 4, 0, 'kept (tokenize step stats)',
           sum(value) FILTER (metric = 'documents')::BIGINT, sum(value) FILTER (metric = 'tokens')::BIGINT
    FROM stats s JOIN (SELECT dataset_name, max(step) AS step FROM stats
                       WHERE metric = 'documents' AND step_type <> 'READER' AND pipeline = ''
                       GROUP BY ALL) last
         ON s.dataset_name = last.dataset_name AND s.step = last.step AND s.pipeline = ''
    GROUP BY ALL
    UNION ALL
    SELECT dataset_name, 5, 0, 'dropped (excluded/ rows)', count(*), NULL FROM excluded GROUP BY ALL
    UNION ALL
    SELECT dataset_name, 6, 0, 'shards', count(DISTINCT shard), sum(n_tokens) FROM docs GROUP BY ALL
)
SELECT f.dataset_name, f.item, f.documents,
       CASE WHEN f.item <> 'shards' THEN round(100.0 * f.documents / r.n, 2) END AS pct_of_read, f.tokens
FROM funnel f LEFT JOIN read r USING (dataset_name)
ORDER BY f.dataset_name, f.ord, f.step
""",
    # Dropped documents by filter and reason; numbers in the reason are folded to N so
    # "int_score 2 < 3" and "int_score 1 < 3" count together, and so are what names one document
    # (dedup's kept id, decontamination's quoted words) (`example` keeps one as written).
    # Decontamination: one row per task and split, their names as written (anli_r1 and anli_r2 are two
    # rows), a document counted under every task its reason names ('… (also T2, T3)', split from
    # dataset.json): each row's documents are dataset.json's decontaminate.tasks[].removed, so these
    # rows may add up to more than the documents dropped (pct_of_dropped: of the documents dropped).
    "drops": """
WITH by_reason AS (
    -- decontamination's first task and split (pipelines/decontam/ngram.py Match.detail); '' for the others
    SELECT dataset_name, filter, reason, count(*) AS n,
           regexp_extract(if(filter = 'decontaminate', reason, ''), '^\\d+-gram of (\\S+) (\\S+) doc \\d+: ',
                          ['task', 'split']) AS first
    FROM excluded GROUP BY ALL
), decontam AS (
    -- after the quoted words (no quote in them), as Python's _DETAIL (anchored: a name holding '" ('
    -- was read from there): names may hold parentheses, never whitespace
    SELECT *, unnest([first.task] || string_split(regexp_extract(reason,
              '^\\d+-gram of \\S+ \\S+ doc \\d+: "[^"]*" '
              || '\\((?:\\+\\d+ more indexed \\d+-grams; )?also (.*)\\)$', 1), ', '))
              AS task
    FROM by_reason WHERE first.task <> ''
), splits AS (
    SELECT dataset_name, t.value->>'name' AS task, t.value->>'split' AS split
    FROM dataset, json_each(json->'decontaminate'->'tasks') t
), kinds AS (
    SELECT dataset_name, filter, reason, n, true AS named_first,
           regexp_replace(regexp_replace(regexp_replace(regexp_replace(reason, 'duplicate of .*$',
                                                                       'duplicate of <id>'),
                                                        ': ".*$', ': "…"'),
                                         -- a range, then a number (1.2e-05 too), not a name's digit
                                         -- ("invalid UTF-8": trial RV66b F5, RV66f F2)
                                         '(^|[^\\w-])\\d+(\\.\\d+)?([eE][-+]?\\d+)?'
                                         || '-\\d+(\\.\\d+)?([eE][-+]?\\d+)?', '\\1N-N', 'g'),
                          '(^|[^\\w-]|[^\\w]-|^-)\\d+(\\.\\d+)?([eE][-+]?\\d+)?', '\\1N', 'g') AS kind
    FROM by_reason WHERE first.task = ''
    UNION ALL
    SELECT d.dataset_name, d.filter, d.reason, d.n, d.task = d.first.task,
           'N-gram of ' || d.task || ' ' || CASE WHEN d.task = d.first.task THEN d.first.split
                                                 ELSE coalesce(s.split, '?') END || ' doc N: "…"'
    FROM decontam d LEFT JOIN splits s ON s.dataset_name = d.dataset_name AND s.task = d.task
    WHERE d.task <> ''
), dropped AS (SELECT dataset_name, sum(n) AS n FROM by_reason GROUP BY ALL)
SELECT dataset_name, k.filter, k.kind AS reason, sum(k.n)::BIGINT AS documents,
       round(100.0 * sum(k.n) / any_value(dropped.n), 2) AS pct_of_dropped,
       -- one naming the row's task first where there is one; ties by the reason: the same one every time
       arg_max(k.reason, row(k.named_first, k.n, k.reason)) AS example
FROM kinds k JOIN dropped USING (dataset_name)
GROUP BY 1, 2, 3
ORDER BY dataset_name, documents DESC, k.filter, reason
""",
    "tokens_by_dump": """
SELECT dataset_name, dump, count(*) AS documents, sum(n_tokens) AS tokens,
       round(100.0 * sum(n_tokens) / sum(sum(n_tokens)) OVER (PARTITION BY dataset_name), 2) AS pct_of_tokens
FROM docs
GROUP BY 1, 2
ORDER BY dataset_name, tokens DESC
""",
    # The domain is urllib.parse.urlsplit(url).hostname without "www.": the netloc ('//' after an optional
    # scheme, up to the first '/', '?' or '#': one regex per document, 0.9 s for 10M on 2 cores, 0.1 s more
    # than the split at '/' it replaced), then, per distinct netloc, what follows the last '@'
    # (user:password), inside '[…]' (IPv6) or before ':' (port). Null: no host. Cutting at the third '/'
    # made `site?p=1`, `user` and `[` domains (review R31b F7). As urllib, leading C0 controls and spaces
    # are skipped and tab, CR and LF anywhere are no characters: a crawl's ' https://…' or '…\n' had no
    # host or another (review RV32d 7). Each is where the regex can take it with one pass (a '\t' both
    # before and in place of an absent scheme made it 4x slower). The share is rounded once, here, to 2
    # decimals (to 3 here, then to 2 by the table, 7.8355 % showed as 7.83: trial RV57b F2; the table
    # rounds none: trial RV69a 5).
    "top_domains": r"""
WITH hosts AS (
    SELECT dataset_name, regexp_extract(
               url, '^[\x00-\x20]*(?:[A-Za-z][A-Za-z0-9+.\t\n\r-]*:[\t\n\r]*)?/[\t\n\r]*/([^/?#]*)', 1
           ) AS netloc, count(*) AS documents, sum(n_tokens) AS tokens
    FROM docs GROUP BY ALL
), hostnames AS (
    SELECT *, CASE WHEN contains(h, '[') THEN split_part(split_part(h, '[', 2), ']', 1)
                   ELSE split_part(h, ':', 1) END AS hostname
    FROM (SELECT *, regexp_replace(regexp_replace(netloc, '[\t\n\r]', '', 'g'), '^.*@', '') AS h FROM hosts)
), domains AS (
    SELECT dataset_name, nullif(regexp_replace(lower(hostname), '^www\.', ''), '') AS domain,
           sum(documents)::BIGINT AS documents, sum(tokens)::BIGINT AS tokens
    FROM hostnames GROUP BY 1, 2
)
SELECT dataset_name, domain, documents, tokens,
       round(100.0 * tokens / sum(tokens) OVER (PARTITION BY dataset_name), 2) AS pct_of_tokens
FROM domains
QUALIFY row_number() OVER (PARTITION BY dataset_name ORDER BY tokens DESC, domain) <= 20
ORDER BY dataset_name, tokens DESC, domain
""",
    # Document lengths in tokens (separator included), in power-of-two buckets [lo, hi).
    "lengths": """
WITH b AS (
    SELECT dataset_name, floor(log2(greatest(n_tokens, 1)))::INTEGER AS b, count(*) AS documents,
           sum(n_tokens)::BIGINT AS tokens
    FROM docs GROUP BY ALL
)
SELECT dataset_name, (2 ** b)::BIGINT AS tokens_from, (2 ** (b + 1))::BIGINT AS tokens_below,
       documents, tokens,
       round(100.0 * documents / sum(documents) OVER (PARTITION BY dataset_name), 2) AS pct_of_documents
FROM b
ORDER BY dataset_name, tokens_from
""",
    # FineWeb-Edu's classifier scores of the kept documents.
    "scores": """
SELECT dataset_name, int_score, count(*) AS documents, sum(n_tokens) AS tokens,
       round(min(score), 3) AS min_score, round(avg(score), 3) AS mean_score,
       round(max(score), 3) AS max_score,
       round(100.0 * count(*) / sum(count(*)) OVER (PARTITION BY dataset_name), 2) AS pct_of_documents
FROM docs
GROUP BY 1, 2
ORDER BY dataset_name, int_score NULLS FIRST
""",
    # The median as it is (a BIGINT cut 251,014.5 to 251014: trial RV57b F3).
    "shard_balance": """
SELECT dataset_name, count(*) AS shards, min(tokens) AS min_tokens, median(tokens) AS median_tokens,
       max(tokens) AS max_tokens, round(max(tokens) / nullif(median(tokens), 0), 3) AS max_over_median,
       min(documents) AS min_documents, max(documents) AS max_documents,
       sum(file_bytes) AS file_bytes
FROM shards
GROUP BY ALL
ORDER BY dataset_name
""",
    # Source ids, urls and texts kept more than once (a source with duplicate rows, overlapping
    # inputs, a build without exact dedup): a text by the hash exact dedup compares (case and
    # whitespace folded). Hashes find the candidates cheaply; the values are then grouped to confirm.
    "duplicates": """
WITH long AS (
    SELECT dataset_name, 'id' AS field, id AS value, key FROM docs WHERE id IS NOT NULL
    UNION ALL
    SELECT dataset_name, 'url', url, key FROM docs WHERE url IS NOT NULL
    UNION ALL
    SELECT dataset_name, 'text', text_hash, key FROM docs WHERE text_hash IS NOT NULL
), candidates AS (
    SELECT dataset_name, field, hash(value) AS h FROM long GROUP BY ALL HAVING count(*) > 1
)
SELECT dataset_name, field, value, count(*) AS copies, list(key ORDER BY key)[1:5] AS keys
FROM long l SEMI JOIN candidates c
     ON l.dataset_name = c.dataset_name AND l.field = c.field AND hash(l.value) = c.h
GROUP BY 1, 2, 3 HAVING count(*) > 1
ORDER BY dataset_name, field, copies DESC, value
""",
    # The last `gristmill data validate` of each dataset, and whether it checked the dataset as
    # it is now (same fingerprint, its files the versions it checked) or an earlier build.
    "validation": """
SELECT d.dataset_name,
       CASE WHEN v.json IS NULL THEN 'not validated'
            WHEN json_type(v.json) <> 'OBJECT'
                 OR (v.fingerprint IS NOT DISTINCT FROM d.fingerprint AND v.ok IS NULL)
                 THEN 'record damaged (no verdict): validate again'
            WHEN v.fingerprint IS DISTINCT FROM d.fingerprint
                 THEN 'stale (dataset rebuilt since): validate again'
            WHEN v.files_changed > 0 THEN 'stale (files changed since): validate again'
            WHEN v.ok THEN 'ok' ELSE 'FAILED' END AS status,
       v.problems, v.checked_at, v.shards, v.documents, v.tokens, v.separators, d.fingerprint
FROM dataset d LEFT JOIN validation v USING (dataset_name)
ORDER BY d.dataset_name
""",
    # A training run's data so far (RUN/consumption.parquet, rewritten at every logged step): per
    # phase and source the tokens trained, those of steps a rewind skipped (and which rewinds), the
    # stream tokens read and the share of the dataset.
    "consumption": """
SELECT dataset_name, phase, source, seq_len, steps, tokens, skipped_tokens, rewinds, stream_tokens, epoch,
       round(100 * fraction, 2) AS pct_of_dataset, step AS after_step
FROM consumption
ORDER BY dataset_name, phase_index, source_index
""",
}

# Each filter's drops with one reason as written: the build's advice when no document survived. An
# --sql query, which an unfinished build answers (no dataset.json: the presets are refused).
WHY_DROPPED_SQL = (
    "SELECT filter, count(*) AS documents, min(reason) AS example FROM excluded GROUP BY filter "
    "ORDER BY documents DESC"
)

# What `gristmill data audit DIR` prints without --report/--sql, and `make demo` at its end.
DEFAULT_REPORTS = ["summary", "drops", "tokens_by_dump", "shard_balance", "validation"]
# Tables of FineWeb's own columns -> the docs column each groups by: the default report leaves one
# out when no document has that column (a user's own files), --report still prints it.
FINEWEB_ONLY = {"tokens_by_dump": "dump", "top_domains": "url", "scores": "int_score"}
# ... and for training run directories (no dataset.json among the roots).
RUN_REPORTS = ["consumption"]

# Presets drawn by --plots: preset -> (x column, y column, kind, the x axis in words); one PNG each,
# a series per dataset. A FINEWEB_ONLY preset is drawn only when some document has its column.
PLOTS: dict[str, tuple[str, str, str, str]] = {
    "lengths": ("tokens_from", "documents", "bar", "document length in tokens (each bin: from n to 2n)"),
    "tokens_by_dump": ("dump", "tokens", "bar", "Common Crawl dump"),
    "top_domains": ("domain", "tokens", "barh", "domain"),
    "scores": ("int_score", "documents", "bar", "FineWeb-Edu int_score"),
    "drops": ("reason", "documents", "barh", "why dropped"),
}
