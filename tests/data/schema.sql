CREATE TABLE migrations (version INTEGER PRIMARY KEY, applied_at TEXT);
CREATE TABLE "sessions" (
   "id" TEXT PRIMARY KEY,
   "user_id" TEXT NOT NULL,
   "token_limit" INTEGER NOT NULL,
   "ratio" REAL NOT NULL,
   "flush_size" INTEGER NOT NULL,
   "created_at" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   "version" INTEGER DEFAULT 0,
   "active_messages" INTEGER DEFAULT 0,
   "archived_messages" INTEGER DEFAULT 0,
   "active_tokens" INTEGER DEFAULT 0,
   "flushes" INTEGER DEFAULT 0
, "source_id" TEXT, "title" TEXT, "metadata" TEXT);
CREATE TABLE "flushes" (
   "id" INTEGER PRIMARY KEY,
   "session_id" TEXT NOT NULL REFERENCES "sessions"("id"),
   "created_at" TEXT NOT NULL,
   "messages" INTEGER NOT NULL,
   "tokens" INTEGER NOT NULL,
   "first_message_id" INTEGER,
   "last_message_id" INTEGER,
   "reason" TEXT
);
CREATE TABLE "messages" (
   "id" INTEGER PRIMARY KEY,
   "session_id" TEXT NOT NULL REFERENCES "sessions"("id"),
   "seq" INTEGER NOT NULL,
   "role" TEXT NOT NULL,
   "content" TEXT NOT NULL,
   "name" TEXT,
   "metadata" TEXT,
   "tokens" INTEGER NOT NULL,
   "status" TEXT NOT NULL,
   "flush_id" INTEGER REFERENCES "flushes"("id"),
   "timestamp" TEXT,
   "created_at" TEXT NOT NULL
);
CREATE INDEX "messages_window"
    ON "messages" ("session_id", "status", "seq");
CREATE UNIQUE INDEX "messages_order"
    ON "messages" ("session_id", "seq");
CREATE INDEX "messages_flush"
    ON "messages" ("flush_id");
CREATE INDEX "flushes_session"
    ON "flushes" ("session_id", "id");
CREATE INDEX "sessions_user"
    ON "sessions" ("user_id");
CREATE TABLE "counters" (
   "name" TEXT PRIMARY KEY,
   "value" INTEGER NOT NULL
);
CREATE TABLE "block_flushes" (
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "flush_id" INTEGER NOT NULL,
   "status" TEXT NOT NULL,
   "error" TEXT,
   "updated_at" TEXT NOT NULL, "attempts" INTEGER NOT NULL DEFAULT 0, "retry_after" INTEGER,
   PRIMARY KEY ("block", "scope_key", "flush_id")
);
CREATE TABLE "block_state" (
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "value" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   PRIMARY KEY ("block", "scope_key")
);
CREATE TABLE "facts" (
   "id" INTEGER PRIMARY KEY,
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "text" TEXT NOT NULL,
   "norm" TEXT NOT NULL,
   "origin" TEXT NOT NULL,
   "session_id" TEXT,
   "flush_id" INTEGER,
   "message_ids" TEXT,
   "created_at" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL,
   "deleted_at" TEXT
, "state" TEXT NOT NULL DEFAULT 'current', "superseded_by" INTEGER, "reason" TEXT, "valid_from" TEXT, "expires_at" TEXT, "entities" TEXT);
CREATE INDEX "facts_scope"
    ON "facts" ("block", "scope_key", "deleted_at");
CREATE TABLE "fact_history" (
   "id" INTEGER PRIMARY KEY,
   "fact_id" INTEGER NOT NULL,
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "action" TEXT NOT NULL,
   "text" TEXT,
   "old_text" TEXT,
   "flush_id" INTEGER,
   "at" TEXT NOT NULL
, "origin" TEXT NOT NULL DEFAULT 'unknown', "topics" TEXT, "old_topics" TEXT, "reason" TEXT);
CREATE INDEX "fact_history_scope"
    ON "fact_history" ("block", "scope_key");
CREATE TABLE "retrieval_vectors" (
   "id" INTEGER PRIMARY KEY,
   "message_id" INTEGER NOT NULL,
   "piece" INTEGER NOT NULL,
   "model" TEXT NOT NULL,
   "dim" INTEGER NOT NULL,
   "vector" BLOB NOT NULL
);
CREATE TABLE "retrieval_state" (
   "key" TEXT PRIMARY KEY,
   "value" TEXT
);
CREATE TABLE "retrieval_redo" (
   "message_id" INTEGER PRIMARY KEY
);
CREATE TRIGGER retrieval_vector_delete AFTER DELETE ON retrieval_vectors BEGIN INSERT INTO retrieval_state (key, value) VALUES ('vectors_deleted', '1') ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1; END;
CREATE TRIGGER retrieval_delete AFTER DELETE ON messages BEGIN DELETE FROM retrieval_vectors WHERE message_id = old.id; END;
CREATE TRIGGER retrieval_update AFTER UPDATE OF name, content ON messages BEGIN DELETE FROM retrieval_vectors WHERE message_id = old.id; INSERT OR IGNORE INTO retrieval_redo (message_id) VALUES (old.id); END;
CREATE UNIQUE INDEX "retrieval_vectors_key"
    ON "retrieval_vectors" ("message_id", "piece", "model");
CREATE TABLE "block_definitions" (
   "session_id" TEXT PRIMARY KEY,
   "definitions" TEXT NOT NULL,
   "updated_at" TEXT NOT NULL
);
CREATE TRIGGER "block_definitions_gone" AFTER DELETE ON "sessions" BEGIN DELETE FROM block_definitions WHERE session_id = old.id; END;
CREATE TABLE "fact_topics" (
   "fact_id" INTEGER NOT NULL,
   "topic" TEXT NOT NULL,
   PRIMARY KEY ("fact_id", "topic")
) WITHOUT ROWID;
CREATE INDEX "fact_topics_topic"
    ON "fact_topics" ("topic", "fact_id");
CREATE TABLE "summaries" (
   "session_id" TEXT NOT NULL,
   "block" TEXT NOT NULL,
   "version" INTEGER NOT NULL,
   "text" TEXT NOT NULL,
   "tokens" INTEGER NOT NULL,
   "flush_id" INTEGER,
   "first_message_id" INTEGER,
   "last_message_id" INTEGER,
   "created_at" TEXT NOT NULL,
   PRIMARY KEY ("session_id", "block", "version")
);
CREATE TRIGGER "summaries_gone" AFTER DELETE ON "sessions" BEGIN DELETE FROM summaries WHERE session_id = old.id; END;
CREATE INDEX "sessions_source" ON "sessions" ("user_id", "source_id");
CREATE TABLE "block_reads" (
   "block" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "session_id" TEXT NOT NULL REFERENCES "sessions"("id") ON DELETE CASCADE,
   "first_message_id" INTEGER NOT NULL,
   "last_message_id" INTEGER NOT NULL,
   "messages" INTEGER NOT NULL,
   "read_at" TEXT NOT NULL,
   PRIMARY KEY ("block", "scope_key", "session_id", "first_message_id")
);
CREATE TABLE "mcp_tokens" (
   "id" INTEGER PRIMARY KEY,
   "user_id" TEXT NOT NULL,
   "token_hash" TEXT NOT NULL UNIQUE,
   "created_at" TEXT NOT NULL
);
CREATE TABLE "deleted_sources" (
   "session_id" TEXT NOT NULL,
   "message_id" INTEGER NOT NULL,
   "source_hash" TEXT NOT NULL,
   PRIMARY KEY ("session_id", "message_id")
);
CREATE TABLE "unfinished_deletes" (
   "id" INTEGER PRIMARY KEY,
   "created_at" TEXT NOT NULL
);
CREATE TABLE "retrieval_marks" (
   "model" TEXT NOT NULL,
   "scope_key" TEXT NOT NULL,
   "through" INTEGER NOT NULL,
   PRIMARY KEY ("model", "scope_key")
);
CREATE INDEX "messages_session_id"
    ON "messages" ("session_id", "id");
CREATE TRIGGER "retrieval_marks_gone" AFTER DELETE ON "sessions" BEGIN DELETE FROM retrieval_marks WHERE scope_key = 'session:' || old.id OR (scope_key = 'user:' || old.user_id AND NOT EXISTS (SELECT 1 FROM sessions WHERE user_id = old.user_id)); END;
CREATE INDEX "messages_time" ON "messages" ("session_id", CAST(ROUND((julianday(COALESCE(timestamp, created_at)) - 2440587.5) * 86400000.0) AS INTEGER));
CREATE INDEX "retrieval_marks_scope" ON "retrieval_marks" ("scope_key");
CREATE VIEW retrieval_folded AS SELECT id, name, content FROM (SELECT id, CASE WHEN length(CAST(name AS BLOB)) = length(name) OR name NOT GLOB '*[øØæÆœŒłŁđĐðÐßẞıþÞħĦŧŦǠǡ]*' THEN name ELSE replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(name, 'ø', 'o'), 'Ø', 'o'), 'æ', 'ae'), 'Æ', 'ae'), 'œ', 'oe'), 'Œ', 'oe'), 'ł', 'l'), 'Ł', 'l'), 'đ', 'd'), 'Đ', 'd'), 'ð', 'd'), 'Ð', 'd'), 'ß', 'ss'), 'ẞ', 'ss'), 'ı', 'i'), 'þ', 'th'), 'Þ', 'th'), 'ħ', 'h'), 'Ħ', 'h'), 'ŧ', 't'), 'Ŧ', 't'), 'Ǡ', 'a'), 'ǡ', 'a') END AS name, CASE WHEN length(CAST(content AS BLOB)) = length(content) OR content NOT GLOB '*[øØæÆœŒłŁđĐðÐßẞıþÞħĦŧŦǠǡ]*' THEN content ELSE replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(content, 'ø', 'o'), 'Ø', 'o'), 'æ', 'ae'), 'Æ', 'ae'), 'œ', 'oe'), 'Œ', 'oe'), 'ł', 'l'), 'Ł', 'l'), 'đ', 'd'), 'Đ', 'd'), 'ð', 'd'), 'Ð', 'd'), 'ß', 'ss'), 'ẞ', 'ss'), 'ı', 'i'), 'þ', 'th'), 'Þ', 'th'), 'ħ', 'h'), 'Ħ', 'h'), 'ŧ', 't'), 'Ŧ', 't'), 'Ǡ', 'a'), 'ǡ', 'a') END AS content FROM messages);
CREATE VIRTUAL TABLE retrieval_fts USING fts5(name, content, content='retrieval_folded', content_rowid='id', tokenize='porter unicode61 remove_diacritics 2');
CREATE TABLE 'retrieval_fts_data'(id INTEGER PRIMARY KEY, block BLOB);
CREATE TABLE 'retrieval_fts_idx'(segid, term, pgno, PRIMARY KEY(segid, term)) WITHOUT ROWID;
CREATE TABLE 'retrieval_fts_docsize'(id INTEGER PRIMARY KEY, sz BLOB);
CREATE TABLE 'retrieval_fts_config'(k PRIMARY KEY, v) WITHOUT ROWID;
CREATE TRIGGER retrieval_fts_delete AFTER DELETE ON messages WHEN old.id <= (SELECT COALESCE(MAX(CAST(value AS INTEGER)), 0) FROM retrieval_state WHERE key = 'fts_through') BEGIN INSERT INTO retrieval_fts (retrieval_fts, rowid, name, content) SELECT 'delete', old.id, name, content FROM (SELECT CASE WHEN length(CAST(name AS BLOB)) = length(name) OR name NOT GLOB '*[øØæÆœŒłŁđĐðÐßẞıþÞħĦŧŦǠǡ]*' THEN name ELSE replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(name, 'ø', 'o'), 'Ø', 'o'), 'æ', 'ae'), 'Æ', 'ae'), 'œ', 'oe'), 'Œ', 'oe'), 'ł', 'l'), 'Ł', 'l'), 'đ', 'd'), 'Đ', 'd'), 'ð', 'd'), 'Ð', 'd'), 'ß', 'ss'), 'ẞ', 'ss'), 'ı', 'i'), 'þ', 'th'), 'Þ', 'th'), 'ħ', 'h'), 'Ħ', 'h'), 'ŧ', 't'), 'Ŧ', 't'), 'Ǡ', 'a'), 'ǡ', 'a') END AS name, CASE WHEN length(CAST(content AS BLOB)) = length(content) OR content NOT GLOB '*[øØæÆœŒłŁđĐðÐßẞıþÞħĦŧŦǠǡ]*' THEN content ELSE replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(content, 'ø', 'o'), 'Ø', 'o'), 'æ', 'ae'), 'Æ', 'ae'), 'œ', 'oe'), 'Œ', 'oe'), 'ł', 'l'), 'Ł', 'l'), 'đ', 'd'), 'Đ', 'd'), 'ð', 'd'), 'Ð', 'd'), 'ß', 'ss'), 'ẞ', 'ss'), 'ı', 'i'), 'þ', 'th'), 'Þ', 'th'), 'ħ', 'h'), 'Ħ', 'h'), 'ŧ', 't'), 'Ŧ', 't'), 'Ǡ', 'a'), 'ǡ', 'a') END AS content FROM (SELECT old.name AS name, old.content AS content)); END;
CREATE TRIGGER retrieval_fts_update AFTER UPDATE OF name, content ON messages WHEN old.id <= (SELECT COALESCE(MAX(CAST(value AS INTEGER)), 0) FROM retrieval_state WHERE key = 'fts_through') BEGIN INSERT INTO retrieval_fts (retrieval_fts, rowid, name, content) SELECT 'delete', old.id, name, content FROM (SELECT CASE WHEN length(CAST(name AS BLOB)) = length(name) OR name NOT GLOB '*[øØæÆœŒłŁđĐðÐßẞıþÞħĦŧŦǠǡ]*' THEN name ELSE replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(name, 'ø', 'o'), 'Ø', 'o'), 'æ', 'ae'), 'Æ', 'ae'), 'œ', 'oe'), 'Œ', 'oe'), 'ł', 'l'), 'Ł', 'l'), 'đ', 'd'), 'Đ', 'd'), 'ð', 'd'), 'Ð', 'd'), 'ß', 'ss'), 'ẞ', 'ss'), 'ı', 'i'), 'þ', 'th'), 'Þ', 'th'), 'ħ', 'h'), 'Ħ', 'h'), 'ŧ', 't'), 'Ŧ', 't'), 'Ǡ', 'a'), 'ǡ', 'a') END AS name, CASE WHEN length(CAST(content AS BLOB)) = length(content) OR content NOT GLOB '*[øØæÆœŒłŁđĐðÐßẞıþÞħĦŧŦǠǡ]*' THEN content ELSE replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(replace(content, 'ø', 'o'), 'Ø', 'o'), 'æ', 'ae'), 'Æ', 'ae'), 'œ', 'oe'), 'Œ', 'oe'), 'ł', 'l'), 'Ł', 'l'), 'đ', 'd'), 'Đ', 'd'), 'ð', 'd'), 'Ð', 'd'), 'ß', 'ss'), 'ẞ', 'ss'), 'ı', 'i'), 'þ', 'th'), 'Þ', 'th'), 'ħ', 'h'), 'Ħ', 'h'), 'ŧ', 't'), 'Ŧ', 't'), 'Ǡ', 'a'), 'ǡ', 'a') END AS content FROM (SELECT old.name AS name, old.content AS content)); INSERT INTO retrieval_fts (rowid, name, content) SELECT id, name, content FROM retrieval_folded WHERE id = new.id; END;
