// The fastest peer of scripts/bench: a franz-go group consumer written the way its
// documentation shows. It subscribes, polls batches of fetches (PollFetches), marks each
// poll's records for commit, stops once every assigned partition has reached the high
// watermark its last fetch reported, commits the marks, and leaves the group (Close).
// franz-go's own fetch settings: this row is what that client does out of the box.
//
//	franz --brokers 127.0.0.1:9092 --topic bench --group g1 [--session-timeout-ms 1000]
//
// At the end it writes the line bare_consumer writes, on stderr:
// at=bench_phases messages=N join_ms=J consume_ms=C commit_ms=K
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	started := time.Now()
	brokers := flag.String("brokers", "", "HOST:PORT")
	topic := flag.String("topic", "", "the topic")
	group := flag.String("group", "", "the consumer group")
	session := flag.Int("session-timeout-ms", 1000, "session.timeout.ms")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	flag.Parse()
	if *brokers == "" || *topic == "" || *group == "" {
		fmt.Fprintln(os.Stderr, "usage: franz --brokers HOST:PORT --topic TOPIC --group GROUP [--session-timeout-ms MS]")
		os.Exit(2)
	}
	if err := run(started, *brokers, *topic, *group, *session, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(started time.Time, brokers, topic, group string, sessionMs int, timeout time.Duration) error {
	var mu sync.Mutex
	assigned := 0
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(time.Duration(sessionMs)*time.Millisecond),
		kgo.HeartbeatInterval(time.Duration(sessionMs/3)*time.Millisecond),
		kgo.AutoCommitMarks(),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			mu.Lock()
			defer mu.Unlock()
			for _, ps := range parts {
				assigned += len(ps)
			}
		}),
	)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	defer cl.Close()

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	atEnd := map[int32]bool{}
	var messages int64
	var first time.Time
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("not at the end of every partition after %v (%d messages)", timeout, messages)
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			fetchErr = fmt.Errorf("fetch %s/%d: %w", t, p, err)
		})
		if fetchErr != nil {
			return fetchErr
		}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if n := len(p.Records); n > 0 {
				if first.IsZero() {
					first = time.Now()
				}
				messages += int64(n)
				atEnd[p.Partition] = p.Records[n-1].Offset+1 >= p.HighWatermark
			} else if p.HighWatermark >= 0 && p.HighWatermark == p.LogStartOffset {
				atEnd[p.Partition] = true
			}
		})
		cl.MarkCommitRecords(fetches.Records()...)
		mu.Lock()
		n := assigned
		mu.Unlock()
		done := 0
		for _, end := range atEnd {
			if end {
				done++
			}
		}
		if n > 0 && done >= n {
			break
		}
	}
	consumed := time.Now()
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	committed := time.Now()
	if first.IsZero() {
		first = consumed
	}
	fmt.Fprintf(os.Stderr, "at=bench_phases messages=%d join_ms=%d consume_ms=%d commit_ms=%d\n",
		messages, first.Sub(started).Milliseconds(), consumed.Sub(first).Milliseconds(),
		committed.Sub(consumed).Milliseconds())
	return nil
}
