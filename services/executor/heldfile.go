package executor

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// Rows that neither the audit trail nor the executor's own store would take
// (both down, or the database hanging) wait in memory (spool). At shutdown
// they are written to Config.HeldFile, fsynced, and read back at the next
// start, so a restart during an outage keeps them; without a HeldFile the
// shutdown says how many it could not keep (it never drops them silently).
// Appending a row twice is harmless: the trail keeps one row per
// invocation and phase.

// loadHeld reads the rows a previous run kept in the held file into
// memory, to be flushed like any held row. The file stays until a later
// shutdown rewrites it, so a crash before they reach the trail loses
// nothing either.
func (e *Executor) loadHeld() error {
	if e.cfg.HeldFile == "" {
		return nil
	}
	b, err := os.ReadFile(e.cfg.HeldFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("executor: reading the held rows: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	n := 0
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(string(line))
		if err != nil {
			return fmt.Errorf("executor: the held rows in %s, line %d: %w", e.cfg.HeldFile, n+1, err)
		}
		rec, err := decodeSpooled(raw)
		if err != nil {
			return fmt.Errorf("executor: the held rows in %s, line %d: %w", e.cfg.HeldFile, n+1, err)
		}
		e.held = append(e.held, rec)
		n++
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("executor: reading the held rows: %w", err)
	}
	if n > 0 {
		e.log.Warn("audit spool: rows kept at the last shutdown are held again, to be appended when the trail is back", "rows", n, "file", e.cfg.HeldFile)
	}
	return nil
}

// keepHeld writes the rows still held in memory at shutdown to the held
// file (replacing it atomically, fsynced), or — without one, or when it
// cannot be written — logs how many are lost.
func (e *Executor) keepHeld() {
	e.heldMu.Lock()
	recs := append([]*mandatev1.AuditRecord(nil), e.held...)
	e.heldMu.Unlock()
	if e.cfg.HeldFile == "" {
		if len(recs) > 0 {
			e.log.Error("audit spool: rows that neither the trail nor the executor's store would take are lost at shutdown; set --held-file to keep them",
				"rows", len(recs))
		}
		return
	}
	if err := writeHeld(e.cfg.HeldFile, recs); err != nil {
		e.log.Error("audit spool: the rows held at shutdown could not be kept; they are lost", "rows", len(recs), "file", e.cfg.HeldFile, "error", err)
		return
	}
	if len(recs) > 0 {
		e.log.Warn("audit spool: rows held at shutdown kept for the next start", "rows", len(recs), "file", e.cfg.HeldFile)
	}
}

// writeHeld replaces path with recs, one base64 line each (an empty set
// removes it), through a fsynced temporary file in the same directory.
func writeHeld(path string, recs []*mandatev1.AuditRecord) error {
	if len(recs) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	var buf bytes.Buffer
	for _, rec := range recs {
		b, err := encodeSpooled(rec)
		if err != nil {
			return err
		}
		buf.WriteString(base64.StdEncoding.EncodeToString(b))
		buf.WriteByte('\n')
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
