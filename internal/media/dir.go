package media

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// DirStore keeps media in a local directory (media.store: dir): the
// object at <dir>/<key> and its Info beside it as <key>.json, written
// after the object, so an object without its .json is not stored yet. A
// single host's store: the demo's, or a deployment whose consumers share
// a mounted volume.
type DirStore struct {
	dir string
}

// NewDirStore returns a store in dir, created when missing.
func NewDirStore(dir string) (*DirStore, error) {
	if dir == "" {
		return nil, errors.New("media: media.dir is empty")
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("media: media.dir: %w", err)
	}
	return &DirStore{dir: dir}, nil
}

func (d *DirStore) path(key string) string { return filepath.Join(d.dir, filepath.FromSlash(key)) }

// Put implements Store: each file is written to a temporary name, synced
// and renamed, the object before its info.
func (d *DirStore) Put(_ context.Context, key string, r io.Reader, size int64, info Info) error {
	p := d.path(key)
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return fmt.Errorf("media: %w", err)
	}
	if size >= 0 {
		r = io.LimitReader(r, size)
	}
	n, err := writeFile(p, r)
	if err != nil {
		return err
	}
	if size >= 0 && n != size {
		_ = os.Remove(p)
		return fmt.Errorf("media: %s: got %d bytes of %d", key, n, size)
	}
	info.Size = n
	b, _ := json.Marshal(info)
	if _, err := writeFile(p+".json", bytes.NewReader(b)); err != nil {
		return err
	}
	return nil
}

// Open implements Store.
func (d *DirStore) Open(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	info, err := d.Stat(ctx, key)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := os.Open(d.path(key))
	if err != nil {
		return nil, Info{}, fmt.Errorf("media: %w", err)
	}
	return f, info, nil
}

// Stat implements Store.
func (d *DirStore) Stat(_ context.Context, key string) (Info, error) {
	b, err := os.ReadFile(d.path(key) + ".json")
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, ErrNotFound
	}
	if err != nil {
		return Info{}, fmt.Errorf("media: %w", err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, fmt.Errorf("media: %s.json: %w", key, err)
	}
	return info, nil
}

// writeFile writes r to path through a synced temporary file.
func writeFile(path string, r io.Reader) (int64, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return 0, fmt.Errorf("media: %w", err)
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return 0, fmt.Errorf("media: %w", err)
	}
	return n, nil
}
