-- The test-only "probe" family's liveness rule: a probe counts while its hash says 'on'.
family('probe', {
  ids = function(sid)
    local ids = redis.call('SMEMBERS', P .. 'probe:live:' .. sid)
    table.sort(ids)
    return ids
  end,
  verdict = function(id)
    return redis.call('HGET', P .. 'probe:' .. id, 'state') == 'on' and 'live' or false
  end,
  hash = function(id) return P .. 'probe:' .. id end, fields = {'label'},
})
