package media

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config is media.s3: an S3-compatible object store.
type S3Config struct {
	Endpoint  string // host:port
	Bucket    string
	Region    string
	AccessKey string
	SecretKey string
	Prefix    string // prepended to every key
	TLS       bool
}

// S3Store keeps media in an S3-compatible bucket (media.store: s3)
// through minio-go: the object with its Content-Type, the Info as the
// user metadata "kfpipe-info" (base64 of its JSON). A PUT is atomic in S3: a reader sees the
// whole object or none.
type S3Store struct {
	c      *minio.Client
	bucket string
	prefix string
}

// infoMeta is the user metadata key holding the Info (JSON).
const infoMeta = "Kfpipe-Info"

// NewS3Store connects to cfg's endpoint and creates the bucket when it
// is missing.
func NewS3Store(ctx context.Context, cfg S3Config) (*S3Store, error) {
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: cfg.TLS,
		Region: cfg.Region,
	})
	if err != nil {
		return nil, fmt.Errorf("media: media.s3.endpoint: %w", err)
	}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("media: bucket %s at %s: %w", cfg.Bucket, cfg.Endpoint, err)
	}
	if !ok {
		if err := c.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region}); err != nil {
			var er minio.ErrorResponse
			if !errors.As(err, &er) || er.Code != "BucketAlreadyOwnedByYou" {
				return nil, fmt.Errorf("media: create bucket %s: %w", cfg.Bucket, err)
			}
		}
	}
	return &S3Store{c: c, bucket: cfg.Bucket, prefix: cfg.Prefix}, nil
}

// Put implements Store. An object of unknown size is uploaded in parts.
func (s *S3Store) Put(ctx context.Context, key string, r io.Reader, size int64, info Info) error {
	if size >= 0 {
		info.Size = size
	}
	meta := encodeInfo(info)
	ct := info.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	up, err := s.c.PutObject(ctx, s.bucket, s.prefix+key, r, size, minio.PutObjectOptions{
		ContentType:  ct,
		UserMetadata: map[string]string{infoMeta: meta},
	})
	if err != nil {
		return fmt.Errorf("media: put %s: %w", key, err)
	}
	if size >= 0 && up.Size != size {
		return fmt.Errorf("media: put %s: stored %d bytes of %d", key, up.Size, size)
	}
	if size < 0 {
		// The info went up before the size was known: write it again
		// with the size (a copy onto itself, no data moved).
		info.Size = up.Size
		meta = encodeInfo(info)
		_, err := s.c.CopyObject(ctx, minio.CopyDestOptions{Bucket: s.bucket, Object: s.prefix + key,
			ReplaceMetadata: true, UserMetadata: map[string]string{infoMeta: meta}},
			minio.CopySrcOptions{Bucket: s.bucket, Object: s.prefix + key})
		if err != nil {
			return fmt.Errorf("media: put %s: %w", key, err)
		}
	}
	return nil
}

// encodeInfo is info as a header value: S3 metadata is ASCII, a
// customer's file name need not be.
func encodeInfo(info Info) string {
	b, _ := json.Marshal(info)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Open implements Store.
func (s *S3Store) Open(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	obj, err := s.c.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, Info{}, s.err(key, err)
	}
	st, err := obj.Stat()
	if err != nil {
		obj.Close()
		return nil, Info{}, s.err(key, err)
	}
	info, err := infoOf(key, st)
	if err != nil {
		obj.Close()
		return nil, Info{}, err
	}
	return obj, info, nil
}

// Stat implements Store.
func (s *S3Store) Stat(ctx context.Context, key string) (Info, error) {
	st, err := s.c.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s.err(key, err)
	}
	return infoOf(key, st)
}

func (s *S3Store) err(key string, err error) error {
	var er minio.ErrorResponse
	if errors.As(err, &er) && (er.Code == "NoSuchKey" || er.StatusCode == http.StatusNotFound && er.Code != "NoSuchBucket") {
		return ErrNotFound
	}
	return fmt.Errorf("media: %s: %w", key, err)
}

func infoOf(key string, st minio.ObjectInfo) (Info, error) {
	var raw string
	for k, v := range st.UserMetadata {
		if strings.EqualFold(k, infoMeta) || strings.EqualFold(k, "X-Amz-Meta-"+infoMeta) {
			raw = v
		}
	}
	if raw == "" {
		return Info{}, fmt.Errorf("media: %s: object without its %s metadata", key, infoMeta)
	}
	var info Info
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if err == nil {
		err = json.Unmarshal(b, &info)
	}
	if err != nil {
		return Info{}, fmt.Errorf("media: %s: %s metadata: %w", key, infoMeta, err)
	}
	info.Size = st.Size
	return info, nil
}
