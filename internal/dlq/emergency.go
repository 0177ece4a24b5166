package dlq

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// emergencyFile is the last resort of I6: a JSONL file of dead letters
// that could not reach Kafka, fsync'd before the caller is told "durable",
// and replayed to the DLQ topic later.
//
// Replay progress lives in a sidecar file (<path>.offset) holding the byte
// offset up to which records were acknowledged by Kafka. Appends only ever
// go to the end, so that offset stays valid; when everything is replayed
// the sidecar is reset first and the file truncated second, so a crash
// between the two re-sends records (the index is idempotent by ID) instead
// of skipping new ones.
type emergencyFile struct {
	path    string
	lock    *os.File // <path>.lock, flock'd for the life of the value
	mu      sync.Mutex
	f       *os.File // append handle, opened lazily
	needNL  bool     // the file ends in a torn line that must be terminated first
	dirSync bool     // the directory entry of the file was fsync'd
	// memOff is the replay offset when the sidecar could not be written
	// (disk full); the larger of it and the sidecar's counts.
	memOff int64
}

// emergencyRecord is one line read back for replay.
type emergencyRecord struct {
	value []byte // nil for an undecodable (torn) line
	dl    *chatmsg.DeadLetter
	end   int64 // byte offset just after this line
}

func openEmergencyFile(path string) (*emergencyFile, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("emergency file dir: %w", err)
	}
	lock, err := lockEmergencyFile(path)
	if err != nil {
		return nil, err
	}
	e := &emergencyFile{path: path, lock: lock}
	ok := false
	defer func() {
		if !ok {
			_ = lock.Close() // releases the lock
		}
	}()
	size, err := e.size()
	if err != nil {
		return nil, err
	}
	off, err := e.readOffset()
	if err != nil {
		return nil, err
	}
	if off > size {
		// The file was truncated behind the sidecar's back (by hand):
		// restart from the beginning rather than skip what comes next.
		if err := e.writeOffset(0); err != nil {
			return nil, err
		}
	}
	if size > 0 {
		// A crash in the middle of a write leaves a line without its
		// newline; terminate it so the next record is not glued to it
		// (the torn line is skipped at replay, the record after it kept).
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("emergency file: %w", err)
		}
		var last [1]byte
		_, err = f.ReadAt(last[:], size-1)
		_ = f.Close()
		if err != nil {
			return nil, fmt.Errorf("emergency file: %w", err)
		}
		e.needNL = last[0] != '\n'
	}
	ok = true
	return e, nil
}

// ErrEmergencyFileInUse is returned when another process (or another
// producer in this one) has the emergency file open: two writers would
// truncate each other's fsync'd records at replay.
var ErrEmergencyFileInUse = errors.New("dlq: emergency file is in use by another process")

// lockEmergencyFile takes an exclusive, non-blocking flock on <path>.lock
// (a separate file, because the emergency file itself is truncated and
// reopened at replay). The lock goes with the process, so a crash never
// leaves it held.
func lockEmergencyFile(path string) (*os.File, error) {
	lp := path + ".lock"
	f, err := os.OpenFile(lp, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("emergency file lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (lock %s held); give each daemon its own dlq.emergency_file (\"{daemon}\" in the path is replaced by the daemon's name)",
				ErrEmergencyFileInUse, path, lp)
		}
		return nil, fmt.Errorf("emergency file lock %s: %w", lp, err)
	}
	return f, nil
}

func (e *emergencyFile) size() (int64, error) {
	st, err := os.Stat(e.path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("emergency file: %w", err)
	}
	return st.Size(), nil
}

// append writes lines (each one JSON object, without newline) and fsyncs.
// Only after a nil return may the records be treated as durable.
func (e *emergencyFile) append(lines [][]byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.f == nil {
		f, err := os.OpenFile(e.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("open emergency file: %w", err)
		}
		e.f = f
	}
	n := 0
	for _, l := range lines {
		n += len(l) + 1
	}
	buf := make([]byte, 0, n+1)
	if e.needNL {
		buf = append(buf, '\n')
	}
	for _, l := range lines {
		buf = append(buf, l...)
		buf = append(buf, '\n')
	}
	if _, err := e.f.Write(buf); err != nil {
		// Part of buf may be on disk: the next write starts a new line.
		e.needNL = true
		return fmt.Errorf("write emergency file: %w", err)
	}
	if err := e.f.Sync(); err != nil {
		e.needNL = true
		return fmt.Errorf("fsync emergency file: %w", err)
	}
	e.needNL = false
	if !e.dirSync {
		// A new file's directory entry must be durable too.
		if err := syncDir(filepath.Dir(e.path)); err != nil {
			return err
		}
		e.dirSync = true
	}
	return nil
}

// pending reports whether records wait for replay.
func (e *emergencyFile) pending() (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	size, err := e.size()
	if err != nil {
		return false, err
	}
	off, err := e.readOffset()
	return size > max(off, e.memOff), err
}

// readBatch returns up to max complete lines after the replay offset.
func (e *emergencyFile) readBatch(max int, maxBytes int64) ([]emergencyRecord, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	off, err := e.readOffset()
	if err != nil {
		return nil, err
	}
	if e.memOff > off {
		off = e.memOff
	}
	f, err := os.Open(e.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("emergency file: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, fmt.Errorf("emergency file: %w", err)
	}
	r := bufio.NewReaderSize(f, 64<<10)
	var out []emergencyRecord
	var read int64
	pos := off
	for len(out) < max && read < maxBytes {
		line, err := r.ReadBytes('\n')
		if len(line) == 0 || line[len(line)-1] != '\n' {
			// EOF, or a line still unterminated (it is terminated at
			// the next open or append): not part of this batch.
			break
		}
		pos += int64(len(line))
		read += int64(len(line))
		rec := emergencyRecord{end: pos}
		body := line[:len(line)-1]
		if len(strings.TrimSpace(string(body))) > 0 {
			if dl, derr := Decode(body); derr == nil {
				dl.EnsureID()
				rec.value, rec.dl = body, dl
			}
		}
		out = append(out, rec)
		if err != nil {
			break
		}
	}
	return out, nil
}

// commit records that everything before end was acknowledged by Kafka.
// On a full disk the sidecar cannot be rewritten: the offset is kept in
// memory so the replay goes on (a restart replays from the sidecar's
// older offset: duplicates in the topic, which the index absorbs), and
// once everything is replayed the sidecar is removed — which needs no
// space and means offset 0, as writing 0 would — and the file truncated,
// which frees the disk.
func (e *emergencyFile) commit(end int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	size, err := e.size()
	if err != nil {
		return err
	}
	if end < size {
		err := e.writeOffset(end)
		if err == nil || errors.Is(err, syscall.ENOSPC) {
			e.memOff = end
			return nil
		}
		return err
	}
	// Everything replayed: reset the sidecar first, then truncate (see the
	// type comment for why this order is the safe one).
	if err := os.Remove(e.offsetPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("emergency offset: %w", err)
	}
	if err := syncDir(filepath.Dir(e.path)); err != nil {
		return err
	}
	e.memOff = 0
	if e.f != nil {
		_ = e.f.Close()
		e.f = nil
	}
	if err := os.Truncate(e.path, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("truncate emergency file: %w", err)
	}
	f, err := os.OpenFile(e.path, os.O_WRONLY, 0)
	if err == nil {
		err = f.Sync()
		_ = f.Close()
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("fsync emergency file: %w", err)
	}
	e.needNL = false
	return nil
}

func (e *emergencyFile) offsetPath() string { return e.path + ".offset" }

func (e *emergencyFile) readOffset() (int64, error) {
	b, err := os.ReadFile(e.offsetPath())
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("emergency offset: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n < 0 {
		// A garbled sidecar must not lose records: replay from the start.
		return 0, nil
	}
	return n, nil
}

// writeOffset replaces the sidecar atomically: temp file, fsync, rename,
// fsync of the directory.
func (e *emergencyFile) writeOffset(n int64) error {
	tmp := e.offsetPath() + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("emergency offset: %w", err)
	}
	_, err = f.WriteString(strconv.FormatInt(n, 10) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, e.offsetPath())
	}
	if err != nil {
		return fmt.Errorf("emergency offset: %w", err)
	}
	return syncDir(filepath.Dir(e.path))
}

func (e *emergencyFile) close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var err error
	if e.f != nil {
		err = e.f.Close()
		e.f = nil
	}
	if e.lock != nil {
		_ = e.lock.Close() // releases the flock
		e.lock = nil
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir: %w", err)
	}
	return nil
}
