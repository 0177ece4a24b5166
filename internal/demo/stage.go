package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/kfpipe/kfpipe/internal/config"
	"github.com/kfpipe/kfpipe/internal/outcome"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// stage is what every run stands on: the backends, a scratch directory,
// the three configurations and the fake WeChat serving on loopback.
type stage struct {
	be      *backends
	tmp     string
	cfgs    *configs
	fake    *wecomtest.Server
	fakeSrv *http.Server
}

// stageUp starts the backends and the fake WeChat and configures the
// daemons for them; close undoes it.
func stageUp(o Options) (_ *stage, err error) {
	st := &stage{}
	defer func() {
		if err != nil {
			st.close(io.Discard)
		}
	}()
	if st.be, err = startBackends(o.Kafka, o.Redis); err != nil {
		return nil, err
	}
	if st.tmp, err = os.MkdirTemp("", "kfpipe-demo-"); err != nil {
		return nil, err
	}
	// The fake WeChat listens first: its URL goes into the producer's
	// configuration.
	fakeLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fake wechat listen: %w", err)
	}
	if st.cfgs, err = configure(o, st.be, st.tmp, "http://"+fakeLn.Addr().String()); err != nil {
		fakeLn.Close()
		return nil, err
	}
	p := st.cfgs.producer
	st.fake = wecomtest.NewHandler(wecomtest.Options{CorpID: p.WeCom.CorpID, Secret: p.WeCom.Secret, Accounts: p.WeCom.OpenKfIDs})
	st.fakeSrv = &http.Server{Handler: st.fake, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = st.fakeSrv.Serve(fakeLn) }()
	topics := []config.Topic{st.cfgs.common.Kafka.Topics.Main, st.cfgs.common.Kafka.Topics.DLQ}
	if a := st.cfgs.consumer.Archive; a.DSN != "" {
		topics = append(topics, outcome.Topic(st.cfgs.consumer.Kafka, a))
	}
	if err := st.be.createMockTopics(topics...); err != nil {
		return nil, err
	}
	return st, nil
}

// close removes what the run left on real services (reporting to notice
// what it could not), stops the fake and the embedded backends.
func (st *stage) close(notice io.Writer) {
	if st.cfgs != nil && st.be != nil && st.be.suffix != "" {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c := st.cfgs.common
		topics := []string{c.Kafka.Topics.Main.Name, c.Kafka.Topics.DLQ.Name}
		if a := st.cfgs.consumer.Archive; a.DSN != "" {
			topics = append(topics, a.OutcomesTopic)
		}
		if err := st.be.cleanup(cctx, topics, c.Redis.KeyPrefix); err != nil {
			fmt.Fprintf(notice, "demo: cleanup of real services incomplete: %v\n", err)
		}
		cancel()
	}
	if st.fakeSrv != nil {
		st.fakeSrv.Close()
	}
	if st.tmp != "" {
		os.RemoveAll(st.tmp)
	}
	if st.be != nil {
		st.be.close()
	}
}
