-- The reminder family's liveness rule: every stored reminder (armed, or firing until its turn
-- is created) counts.
family('reminder', {
  ids = function(sid)
    local ids = redis.call('SMEMBERS', K.live_reminders(sid))
    table.sort(ids)
    return ids
  end,
  verdict = function() return 'live' end, hash = K.reminder, fields = {'prompt', 'dueAt'},
})
